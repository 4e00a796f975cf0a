"""The data that flows profile -> plan -> apply: pure data, no I/O."""

from dataclasses import dataclass, field

from . import modes
from .values import Value, as_json, render


@dataclass(frozen=True)
class Setting:
    """One knob of a profile, addressed as backend:key."""
    backend: str
    key: str
    mode: str
    wanted: Value
    reason: str
    source: str
    file: str = ""            # the profile file and line it came from,
    line: int | None = None   # for error messages
    waive: str = ""           # the profile's reason to leave it as it is: `waived`, never applied
    critical: bool = False    # the profile marks its drift CRITICAL for monitoring

    @property
    def address(self) -> str:
        return f"{self.backend}:{self.key}"

    @property
    def wanted_text(self) -> str:
        return modes.describe(self.mode, self.wanted)


# Statuses of one setting on one host.
MET, DRIFT, NOT_APPLICABLE, ERROR, WAIVED = "met", "drift", "n/a", "error", "waived"


@dataclass
class Change:
    """A setting measured on this host: what is, what should be, what to do."""
    setting: Setting
    current: Value | None = None
    target: Value | None = None
    status: str = MET
    note: str = ""            # why it cannot be applied here (apply refuses), or the error
    boot: str = ""            # "overridden at boot by FILE:LINE (...)": a later file undoes it
    seen: str = ""            # what reading it found worth saying (processes left out, and why): no obstacle

    @property
    def needed(self) -> bool:
        """Something to write now; a drift that only the next boot causes has no target."""
        return self.status == DRIFT and self.target is not None

    @property
    def notes(self) -> str:
        return "; ".join(n for n in (self.note, self.boot, self.seen) if n)

    def to_json(self) -> dict:
        s = self.setting
        return {
            "setting": s.address, "backend": s.backend, "key": s.key,
            "current": as_json(self.current), "wanted": as_json(s.wanted),
            "current_text": self.current_text(), "wanted_text": s.wanted_text,
            "mode": s.mode, "target": as_json(self.target) if self.needed else None,
            "status": self.status, "reason": s.reason, "source": s.source,
            "note": self.notes, "boot_override": self.boot or None,
            "error": self.note if self.status == ERROR else None, "critical": s.critical,
        }

    def current_text(self) -> str:
        if self.current is None:
            return "-" if self.status in (NOT_APPLICABLE, ERROR) else "unset"
        return render(self.current)


@dataclass
class Plan:
    """Every selected setting of a profile, evaluated on this host."""
    profile: str
    os: str
    params: dict
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def todo(self) -> list[Change]:
        return [c for c in self.changes if c.needed]

    def count(self, status: str) -> int:
        return sum(1 for c in self.changes if c.status == status)

    def exit_code(self) -> int:
        """0 all met, 1 drift, 2 a setting could not be read."""
        if self.count(ERROR):
            return 2
        return 1 if self.count(DRIFT) else 0

    def to_json(self) -> dict:
        return {
            "profile": self.profile, "os": self.os, "params": self.params,
            "settings": [c.to_json() for c in self.changes],
            "summary": {st: self.count(st) for st in (MET, DRIFT, NOT_APPLICABLE, ERROR, WAIVED)},
            "notes": self.notes,
        }

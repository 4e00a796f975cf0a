"""The contract every backend fulfils: one kind of knob on one OS.

Adding a knob kind means adding one module with one Backend subclass and
registering it in backends/__init__.py; plan, apply, journal and rollback
do not change. (The shape follows tuned's plugins: read, write, verify and
undo per knob, assignment modifiers kept elsewhere, in tune/modes.py.)
"""

from abc import ABC, abstractmethod
from pathlib import Path

from proxytune.core.errors import BackendError
from ..host import Host
from ..model import Change, Setting
from ..values import Value, parse, render


class Backend(ABC):
    kind = ""           # the part before the first ':' of a setting address
    os = "linux"
    runtime = True      # False: the knob lives only in a config file
    writes: tuple[str, ...] = ()   # the only files (globs, below the root) this backend writes
    modes = ("value", "at_least", "at_most", "covers")

    def __init__(self, host: Host):
        self.host = host
        self.notes: list[str] = []      # what the last read found worth saying beside the value

    # -- validation (profile load time; raise ValueError with the problem)
    def validate(self, setting: Setting) -> None:
        if setting.mode not in self.modes:
            raise ValueError(f"{self.kind} settings take {' or '.join(self.modes)}, not {setting.mode}")

    # -- the live value
    @abstractmethod
    def read(self, key: str) -> Value | None:
        """Current value; None when unset; raise NotApplicable when the knob is absent."""

    def write(self, key: str, value: Value) -> None:
        """Change the live value. File-only backends have none: their change is file_edits()."""
        raise BackendError(f"{self.kind}:{key} has no live value; it changes through its config file")

    def snapshot(self, key: str):
        """JSON-able old state, precise enough for restore() to put back exactly."""
        current = self.read(key)
        return None if current is None else render(current)

    def restore(self, key: str, snap) -> None:
        self.write(key, parse(snap))

    def at_boot(self, change: Change) -> Change:
        """The change seen from the next boot: files read after ours that undo it
        (Change.boot), or a host file line that cannot be parsed (raise HostFileError)."""
        return change

    def undo(self, key: str, old, wrote, force: bool = False) -> tuple[list[str], list[str]]:
        """Put `old` back, but only while the knob still holds what apply wrote (`wrote`, read
        back after writing; None when the apply died mid-step). Returns (kept, notes): kept
        names what was left alone because someone changed it since; `force` undoes it anyway."""
        now = self.snapshot(key)
        if now == old:
            return [], []
        if wrote is not None and now != wrote and not force:
            return [f"kept: {self.kind}:{key} was changed since the apply (now {show(now)})"], []
        self.restore(key, old)
        return [], []

    def obstacle(self, change: Change) -> str | None:
        """Why applying this change will fail here, if we can tell in advance."""
        return None

    # -- files: persistence for runtime knobs, the knob itself for file-only ones
    def file_edits(self, changes: list[Change]) -> list[tuple[Path, str]]:
        """New contents for the files that make these changes permanent."""
        return []

    def persist_notes(self, changes: list[Change]) -> list[str]:
        """What --persist cannot make permanent for these changes, said out loud."""
        return []

    def after_files(self) -> list[str]:
        """Notes after the files changed (commands run, restarts needed)."""
        return []


def split_pair(key: str, form: str, known) -> tuple[str, str]:
    """Validate and split an `OWNER:NAME` key (squid:nofile, squid:LimitNOFILE, daemon:openfiles).

    `form` is how the key is written, e.g. "SERVICE:LIMIT, e.g. squid:nofile".
    """
    owner, _, name = key.rpartition(":")
    if not owner or any(ch.isspace() for ch in owner):
        raise ValueError(f"expected {form}")
    if name not in known:
        raise ValueError(f"unknown {form.split(':')[1].split(',')[0].lower()} {name!r}; known: {', '.join(known)}")
    return owner, name


def show(snap) -> str:
    """A snapshot on one line, for messages."""
    text = " ".join(str(snap).split()) if not isinstance(snap, (dict, list)) else str(snap)
    return "".join(ch if ch.isprintable() else "?" for ch in text)[:120]

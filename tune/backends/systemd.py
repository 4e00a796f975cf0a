"""systemd unit limits (`service:UNIT:LimitNOFILE`) through a drop-in.

The effective value is what the unit files say, read in systemd's order
(vendor unit, /etc unit, then drop-ins sorted by name; the last assignment
wins), falling back to DefaultLimitNOFILE of system.conf. We write
/etc/systemd/system/UNIT.service.d/proxytune.conf, which sorts after the
usual override.conf, then ask a running systemd to reload.
"""

import re
from pathlib import Path

from ..files import read_text
from .base import Backend, split_pair

DIRECTIVES = ("LimitNOFILE", "LimitNPROC", "LimitMEMLOCK", "LimitCORE")
UNIT_DIRS = ("/lib/systemd/system", "/usr/lib/systemd/system", "/etc/systemd/system", "/run/systemd/system")
DROPIN_NAME = "proxytune.conf"
SYSTEMD_DEFAULT_NOFILE = 1024       # systemd's DefaultLimitNOFILE soft value since v240
UNIT = re.compile(r"^[A-Za-z0-9@_.\-]+$")


class SystemdBackend(Backend):
    kind = "service"
    writes = ("/etc/systemd/system/*.service.d/proxytune.conf",)
    runtime = False
    modes = ("value", "at_least")

    def validate(self, setting):
        super().validate(setting)
        unit, _ = split_pair(setting.key, "UNIT:DIRECTIVE, e.g. squid:LimitNOFILE", DIRECTIVES)
        if not UNIT.match(unit):
            raise ValueError(f"not a systemd unit name: {unit!r}")
        if isinstance(setting.wanted, bool) or not isinstance(setting.wanted, int) or setting.wanted < 1:
            raise ValueError(f"expected a positive integer, got {setting.wanted!r}")

    def _files(self, unit: str) -> list[Path]:
        """Unit file then drop-ins, in the order systemd applies them."""
        name = f"{unit}.service"
        files = [self.host.path(f"{d}/{name}") for d in UNIT_DIRS]
        mains = [f for f in files if f.exists()]
        dropins: dict[str, Path] = {}
        for d in UNIT_DIRS:       # later directories override same-named drop-ins
            for f in sorted(self.host.path(f"{d}/{name}.d").glob("*.conf")):
                dropins[f.name] = f
        return mains[-1:] + [dropins[n] for n in sorted(dropins)]

    def read(self, key):
        unit, _, directive = key.rpartition(":")
        value = None
        for f in self._files(unit):
            for line in (read_text(f) or "").splitlines():
                m = re.match(rf"^\s*{directive}\s*=\s*(\S*)", line)
                if m:
                    value = m.group(1)
        if value is None:
            value = self._default(directive)
        return parse_limit(value)

    def _default(self, directive):
        conf = read_text(self.host.path("/etc/systemd/system.conf")) or ""
        m = re.search(rf"^\s*Default{directive}\s*=\s*(\S+)", conf, re.M)
        if m:
            return m.group(1)
        return str(SYSTEMD_DEFAULT_NOFILE) if directive == "LimitNOFILE" else "infinity"

    def dropin(self, unit: str) -> Path:
        return self.host.path(f"/etc/systemd/system/{unit}.service.d/{DROPIN_NAME}")

    def file_edits(self, changes):
        by_unit: dict[str, dict[str, int]] = {}
        for c in changes:
            unit, _, directive = c.setting.key.rpartition(":")
            by_unit.setdefault(unit, {})[directive] = c.target
        edits = []
        for unit, directives in by_unit.items():
            path = self.dropin(unit)
            old = parse_dropin(read_text(path) or "")
            old.update({k: str(v) for k, v in directives.items()})
            edits.append((path, render_dropin(old)))
        return edits

    def after_files(self):
        if self.host.live and Path("/run/systemd/system").is_dir():
            self.host.runner.run(["systemctl", "daemon-reload"])
            return ["systemd reloaded; restart the service for new limits to take effect"]
        return ["systemd is not running here: the drop-in takes effect when systemd next starts the unit"]


def parse_limit(text: str):
    """'65536', '1024:524288' (soft:hard) or 'infinity' -> the soft value."""
    soft = text.split(":")[0]
    return soft if soft == "infinity" else int(soft)


def parse_dropin(text: str) -> dict[str, str]:
    return dict(re.findall(r"^\s*(Limit[A-Z]+)\s*=\s*(\S+)", text, re.M))


def render_dropin(directives: dict[str, str]) -> str:
    body = "".join(f"{k}={v}\n" for k, v in sorted(directives.items()))
    return "# Written by proxytune; `proxytune tune rollback` removes or restores it.\n[Service]\n" + body

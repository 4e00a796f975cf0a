"""systemd unit limits (`service:UNIT:LimitNOFILE`) through a drop-in.

The effective value is what the unit files say, read in systemd's order
(the unit file from the most important directory, then drop-ins sorted by
name, a drop-in in /etc masking the same name in /run or /usr/lib; the last
assignment wins, an empty `LimitNOFILE=` resets to the default), falling
back to DefaultLimitNOFILE of system.conf and system.conf.d. We write
/etc/systemd/system/UNIT.service.d/50-proxytune.conf, then ask a running
systemd to reload.

Why that name: systemd.unit(5) applies a unit's drop-ins in the lexical
order of their file names, across all its drop-in directories, and a later
assignment wins. `systemctl edit` writes override.conf; "50-proxytune.conf"
sorts before it (digits before letters), so what the admin sets there wins
over what a profile sets, as an admin expects of a tool. (Earlier versions
wrote proxytune.conf, which sorts after override.conf and silently overrode it.)
The other half of that choice: when a drop-in read after ours sets the
directive to a value that does not meet the profile, check reports the
setting as drift and names that file and line (at_boot), so the shadowing is
never silent. A proxytune.conf written by an older apply is still read, is
still named when it shadows ours, and rollback removes it (its journal entry
records the path; `writes` allows both names).

Values are read as systemd reads them: a number (sizes may carry K, M, G,
T, P, E for LimitMEMLOCK/LimitCORE), `infinity`, or SOFT:HARD. What systemd
would reject (`-1`, `unlimited`, `64k` for LimitNOFILE) is an error naming
FILE:LINE, since systemd ignores that line and keeps the earlier value.
"""

import re
from pathlib import Path

from ..hostfiles import HostFileError, lines, read as read_host_file
from ..names import limit_value, service as check_service
from ..model import DRIFT
from .base import Backend, split_pair

DIRECTIVES = ("LimitNOFILE", "LimitNPROC", "LimitMEMLOCK", "LimitCORE")
SIZES = ("LimitMEMLOCK", "LimitCORE")
# Least to most important: a later directory's unit or drop-in replaces an earlier one's.
UNIT_DIRS = ("/lib/systemd/system", "/usr/lib/systemd/system", "/usr/local/lib/systemd/system",
             "/run/systemd/system", "/etc/systemd/system")
CONF_DIRS = ("/lib/systemd/system.conf.d", "/usr/lib/systemd/system.conf.d",
             "/usr/local/lib/systemd/system.conf.d", "/run/systemd/system.conf.d", "/etc/systemd/system.conf.d")
DROPIN_NAME = "50-proxytune.conf"     # sorts before `systemctl edit`'s override.conf: the admin's wins
LEGACY_DROPIN_NAME = "proxytune.conf"  # what earlier versions wrote (after override.conf); rollback still undoes it
SYSTEMD_DEFAULT_NOFILE = 1024       # systemd's DefaultLimitNOFILE soft value since v240
SUFFIX = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50, "E": 2**60}


class SystemdBackend(Backend):
    kind = "service"
    writes = (f"/etc/systemd/system/*.service.d/{DROPIN_NAME}", f"/etc/systemd/system/*.service.d/{LEGACY_DROPIN_NAME}")
    runtime = False
    modes = ("value", "at_least")

    def validate(self, setting):
        super().validate(setting)
        unit, directive = split_pair(setting.key, "UNIT:DIRECTIVE, e.g. squid:LimitNOFILE", DIRECTIVES)
        check_service(unit)
        limit_value(directive, setting.wanted)

    def _files(self, unit: str) -> list[Path]:
        """Unit file then drop-ins, in the order systemd applies them."""
        name = f"{unit}.service"
        mains = [f for f in (self.host.path(f"{d}/{name}") for d in UNIT_DIRS) if f.exists()]
        return mains[-1:] + _dropins([self.host.path(f"{d}/{name}.d") for d in UNIT_DIRS])

    def read(self, key):
        unit, _, directive = key.rpartition(":")
        value, _ = _last(self._files(unit), directive)
        if value is None:
            conf = [self.host.path("/etc/systemd/system.conf")]
            value, _ = _last(conf + _dropins([self.host.path(d) for d in CONF_DIRS]), f"Default{directive}")
        if value is None:
            return SYSTEMD_DEFAULT_NOFILE if directive == "LimitNOFILE" else "infinity"
        return value

    def at_boot(self, change):
        """A drop-in that sorts after ours (an admin's override.conf) and sets a failing value wins over
        ours at every start: drift, naming that file and line."""
        unit, _, directive = change.setting.key.rpartition(":")
        _, where = _last(self._files(unit), directive)
        if change.status == DRIFT and where and where[0].name > DROPIN_NAME and where[0].parent.name.endswith(".d"):
            change.boot = f"overridden at service start by {where[0]}:{where[1]}, which sorts after {DROPIN_NAME}"
        return change

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
            old = parse_dropin(read_host_file(path) or "")
            old.update({k: str(v) for k, v in directives.items()})
            edits.append((path, render_dropin(old)))
        return edits

    def after_files(self):
        if self.host.live and Path("/run/systemd/system").is_dir():
            self.host.runner.run(["systemctl", "daemon-reload"])
            return ["systemd reloaded; restart the service for new limits to take effect"]
        return ["systemd is not running here: the drop-in takes effect when systemd next starts the unit"]


def _dropins(directories: list[Path]) -> list[Path]:
    """*.conf of these directories sorted by name; a later directory masks the same name."""
    found: dict[str, Path] = {}
    for d in directories:
        if d.is_dir():
            found.update({f.name: f for f in d.glob("*.conf")})
    return [found[n] for n in sorted(found)]


def _last(files: list[Path], directive: str):
    """(soft value, (file, line)) of the last `directive=` in these files; value None when unset or
    reset by `directive=`.
    A last assignment systemd would reject is an error: the value then is not what its author meant."""
    value, where, ignored = None, None, None
    for f in files:
        for number, line in lines(read_host_file(f)):
            name, eq, raw = line.strip().partition("=")
            if eq and name.strip() == directive:
                try:
                    value, ignored = parse_limit(raw.strip(), directive, f, number) if raw.strip() else None, None
                    where = (f, number)
                except HostFileError as e:
                    ignored = e         # systemd skips the line and keeps the value before it
    if ignored:
        raise ignored
    return value, where


def parse_limit(text: str, directive: str = "LimitNOFILE", path="", number: int = 0):
    """'65536', '1024:524288' (soft:hard), 'infinity', or a size for memlock/core -> the soft value."""
    soft, _, hard = text.partition(":")
    for part in (soft, hard) if hard else (soft,):
        if part != "infinity" and _number(part, directive) is None:
            raise HostFileError(path, number, f"{directive}={text!r} is not a number, infinity or "
                                "SOFT:HARD; systemd ignores this line")
    return soft if soft == "infinity" else _number(soft, directive)


def _number(text: str, directive: str) -> int | None:
    m = re.fullmatch(r"([0-9]+)([BKMGTPE]?)", text)
    if not m or (m.group(2) and directive not in SIZES):
        return None
    return int(m.group(1)) * SUFFIX[m.group(2)]


def parse_dropin(text: str) -> dict[str, str]:
    return dict(re.findall(r"^\s*(Limit[A-Z]+)\s*=\s*(\S+)", text, re.M))


APPLIED = "# Written by proxytune; `proxytune tune rollback` removes or restores it.\n"    # its journal entry does


def render_dropin(directives: dict[str, str], header: str = APPLIED) -> str:
    """The drop-in; `header` says who can undo it (an exported one is not in any journal)."""
    body = "".join(f"{k}={v}\n" for k, v in sorted(directives.items()))
    return header + "[Service]\n" + body

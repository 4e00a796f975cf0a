"""pam_limits for login sessions (`limits:DOMAIN:nofile`), in limits.d.

The effective value for DOMAIN is the last matching soft line of
/etc/security/limits.conf then limits.d/*.conf in name order. We write
/etc/security/limits.d/90-proxytune.conf with both soft and hard lines.

Lines are read as pam_limits reads them: `#` starts a comment anywhere,
four fields (domain, type, item, value), `-1`/`unlimited`/`infinity` mean
no limit. A line for our domain that pam_limits would skip or misread
(`proxy soft nofile 64k` sets 64) is an error naming FILE:LINE.
"""

import re

from ..model import DRIFT
from ..hostfiles import HostFileError, lines, read as read_host_file
from ..names import limits_domain, limit_value
from proxytune.core.procfs import RLIMITS
from .base import Backend, split_pair

PERSIST_FILE = "/etc/security/limits.d/90-proxytune.conf"
TYPES = ("soft", "hard", "-")
UNLIMITED = ("-1", "unlimited", "infinity")


class LimitsBackend(Backend):
    kind = "limits"
    writes = (PERSIST_FILE,)
    runtime = False
    modes = ("value", "at_least")

    def validate(self, setting):
        super().validate(setting)
        domain, limit = split_pair(setting.key, "DOMAIN:LIMIT, e.g. proxy:nofile", RLIMITS)
        limits_domain(domain)
        limit_value(limit, setting.wanted)

    def _files(self):
        files = [self.host.path("/etc/security/limits.conf")]
        directory = self.host.path("/etc/security/limits.d")
        return files + (sorted(directory.glob("*.conf")) if directory.is_dir() else [])

    def _rows(self, domain: str, item: str):
        """(file, line number, type, value) of every line for this domain and item."""
        for f in self._files():
            for number, line in lines(read_host_file(f)):
                fields = line.split("#", 1)[0].split()
                if not fields or fields[0] != domain:
                    continue
                if len(fields) != 4:
                    raise HostFileError(f, number, f"{len(fields)} fields where pam_limits needs 4 "
                                        "(domain type item value); it skips this line")
                if fields[2] == item:
                    if fields[1] not in TYPES:
                        raise HostFileError(f, number, f"type {fields[1]!r} is not soft, hard or -")
                    yield f, number, fields[1], fields[3]

    def read(self, key):
        domain, _, item = key.rpartition(":")
        value = None
        for f, number, typ, raw in self._rows(domain, item):
            parsed = parse_value(raw, f, number)      # a misread hard line is an error too
            if typ in ("soft", "-"):
                value = parsed
        return value

    def at_boot(self, change):
        """A limits.d file that sorts after ours and sets a failing value wins at every login."""
        domain, _, item = change.setting.key.rpartition(":")
        ours = self.host.path(PERSIST_FILE)
        soft = [(f, number) for f, number, typ, _ in self._rows(domain, item) if typ in ("soft", "-")]
        if change.status == DRIFT and soft and soft[-1][0].parent == ours.parent and soft[-1][0].name > ours.name:
            f, number = soft[-1]
            change.boot = f"overridden at login by {f}:{number}, which sorts after {ours.name}"
        return change

    def file_edits(self, changes):
        path = self.host.path(PERSIST_FILE)
        rows = {}
        for _, line in lines(read_host_file(path)):
            fields = line.split("#", 1)[0].split()
            if len(fields) == 4:
                rows[(fields[0], fields[2])] = fields[3]
        for c in changes:
            domain, _, item = c.setting.key.rpartition(":")
            rows[(domain, item)] = str(c.target)
        return [(path, render_limits(rows))]


def parse_value(raw: str, path, number: int):
    """A limits.conf value as pam_limits takes it: an integer or 'unlimited'."""
    if raw.lower() in UNLIMITED:
        return "unlimited"
    digits = re.match(r"[0-9]*", raw).group()
    if digits == raw:
        return int(raw)
    misread = f"; pam_limits reads it as {int(digits)}" if digits else ""
    raise HostFileError(path, number, f"value {raw!r} is not a number, -1 or unlimited{misread}")


def render_limits(rows: dict[tuple[str, str], str],
                  header: str = "# Written by proxytune; `proxytune tune rollback` removes or restores it.") -> str:
    """The limits.d file; `header` says who can undo it (an exported one is not in any journal)."""
    out = [header]
    for (domain, item), value in sorted(rows.items()):
        out += [f"{domain}\tsoft\t{item}\t{value}", f"{domain}\thard\t{item}\t{value}"]
    return "\n".join(out) + "\n"

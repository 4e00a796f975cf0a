"""pam_limits for login sessions (`limits:DOMAIN:nofile`), in limits.d.

The effective value for DOMAIN is the last matching soft line of
/etc/security/limits.conf then limits.d/*.conf in name order. We write
/etc/security/limits.d/90-proxytune.conf with both soft and hard lines.
"""

import re

from ..files import read_text
from ..procs import RLIMITS
from .base import Backend, split_pair
from .rlimit import check_limit_value

PERSIST_FILE = "/etc/security/limits.d/90-proxytune.conf"
LINE = re.compile(r"^\s*(\S+)\s+(soft|hard|-)\s+(\S+)\s+(\S+)")


class LimitsBackend(Backend):
    kind = "limits"
    writes = (PERSIST_FILE,)
    runtime = False
    modes = ("value", "at_least")

    def validate(self, setting):
        super().validate(setting)
        split_pair(setting.key, "DOMAIN:LIMIT, e.g. proxy:nofile", RLIMITS)
        check_limit_value(setting.wanted)

    def _entries(self):
        files = [self.host.path("/etc/security/limits.conf")]
        files += sorted(self.host.path("/etc/security/limits.d").glob("*.conf"))
        for f in files:
            for line in (read_text(f) or "").splitlines():
                m = LINE.match(line)
                if m and not line.lstrip().startswith("#"):
                    yield m.groups()

    def read(self, key):
        domain, _, item = key.rpartition(":")
        value = None
        for dom, typ, it, val in self._entries():
            if dom == domain and it == item and typ in ("soft", "-"):
                value = val
        if value is None:
            return None
        return value if value in ("unlimited", "infinity") else int(value)

    def file_edits(self, changes):
        path = self.host.path(PERSIST_FILE)
        rows = {}
        for line in (read_text(path) or "").splitlines():
            m = LINE.match(line)
            if m:
                rows[(m.group(1), m.group(3))] = m.group(4)
        for c in changes:
            domain, _, item = c.setting.key.rpartition(":")
            rows[(domain, item)] = str(c.target)
        return [(path, render_limits(rows))]


def render_limits(rows: dict[tuple[str, str], str]) -> str:
    out = ["# Written by proxytune; `proxytune tune rollback` removes or restores it."]
    for (domain, item), value in sorted(rows.items()):
        out += [f"{domain}\tsoft\t{item}\t{value}", f"{domain}\thard\t{item}\t{value}"]
    return "\n".join(out) + "\n"

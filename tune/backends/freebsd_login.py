r"""FreeBSD login classes (`login:CLASS:openfiles`) in /etc/login.conf.

login.conf is a termcap-style database: an entry `class:\` continues while
lines end in a backslash, capabilities sit between colons. We set
`openfiles` (both cur and max) in the class's entry and rebuild the
database with cap_mkdb, as login.conf(5) requires.
"""

import re

from ..files import read_text
from .base import Backend, split_pair
from .rlimit import check_limit_value

FILE = "/etc/login.conf"
CAPS = ("openfiles",)


def _entry_span(lines: list[str], klass: str) -> tuple[int, int] | None:
    """First and last line index of a class entry."""
    for i, line in enumerate(lines):
        if line.startswith("#") or not line.strip():
            continue
        names = line.split(":", 1)[0].split("|")
        if klass in names:
            j = i
            while lines[j].rstrip().endswith("\\") and j + 1 < len(lines):
                j += 1
            return i, j
    return None


def get_cap(text: str, klass: str, cap: str) -> str | None:
    lines = text.splitlines()
    span = _entry_span(lines, klass)
    if span is None:
        return None
    body = "".join(lines[span[0]:span[1] + 1])
    m = re.search(rf":{cap}(?:-cur)?=([^:\\]+)", body)
    return m.group(1).strip() if m else None


def set_cap(text: str, klass: str, cap: str, value: str) -> str:
    lines = text.splitlines()
    span = _entry_span(lines, klass)
    if span is None:
        lines += [f"{klass}:\\", f"\t:{cap}={value}:"]
        return "\n".join(lines) + "\n"
    first, last = span
    pattern = re.compile(rf":{cap}(-cur|-max)?=[^:\\]*:")
    body = [pattern.sub(":", line) for line in lines[first:last + 1]]
    # drop lines that held only our capability, put ours first
    body = [body[0]] + [line for line in body[1:] if not re.fullmatch(r"\s*:?\s*\\?\s*", line)]
    body.insert(1, f"\t:{cap}={value}:")
    body = [line.rstrip().rstrip("\\").rstrip() for line in body]
    kept = [line + "\\" for line in body[:-1]] + [body[-1]]
    lines[first:last + 1] = kept
    return "\n".join(lines) + "\n"


class FreeBSDLoginBackend(Backend):
    kind = "login"
    writes = (FILE,)
    os = "freebsd"
    runtime = False
    modes = ("value", "at_least")

    def validate(self, setting):
        super().validate(setting)
        split_pair(setting.key, "CLASS:CAPABILITY, e.g. daemon:openfiles", CAPS)
        check_limit_value(setting.wanted)

    def read(self, key):
        klass, _, cap = key.rpartition(":")
        value = get_cap(read_text(self.host.path(FILE)) or "", klass, cap)
        if value is None:
            return None
        return value if value in ("unlimited", "infinity") else int(value)

    def file_edits(self, changes):
        path = self.host.path(FILE)
        text = read_text(path) or ""
        for c in changes:
            klass, _, cap = c.setting.key.rpartition(":")
            text = set_cap(text, klass, cap, str(c.target))
        return [(path, text)]

    def after_files(self):
        self.host.runner.run(["cap_mkdb", str(self.host.path(FILE))])
        return ["login.conf database rebuilt; new logins and restarted services get the limit"]

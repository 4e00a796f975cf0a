r"""FreeBSD login classes (`login:CLASS:openfiles`) in /etc/login.conf.

login.conf is a termcap-style database: an entry `class:\` continues while
lines end in a backslash, capabilities sit between colons. We set
`openfiles` (both cur and max) in the class's entry and rebuild the
database with cap_mkdb, as login.conf(5) requires.
"""

import re

from proxytune.core.numbers import is_uint

from ..hostfiles import HostFileError, read as read_text
from ..names import limit_value, login_class
from .base import Backend, split_pair

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
    found = find_cap(text, klass, cap)
    return found and found[0]


def find_cap(text: str, klass: str, cap: str) -> tuple[str, int] | None:
    """(value, line number of the class entry) of a capability."""
    lines = text.splitlines()
    span = _entry_span(lines, klass)
    if span is None:
        return None
    body = "".join(lines[span[0]:span[1] + 1])
    m = re.search(rf":{cap}(?:-cur)?=([^:\\]+)", body)
    return (m.group(1).strip(), span[0] + 1) if m else None


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
        klass, cap = split_pair(setting.key, "CLASS:CAPABILITY, e.g. daemon:openfiles", CAPS)
        login_class(klass)
        limit_value(cap, setting.wanted)

    def read(self, key):
        klass, _, cap = key.rpartition(":")
        path = self.host.path(FILE)
        found = find_cap(read_text(path) or "", klass, cap)
        if found is None:
            return None
        value, number = found
        if value in ("unlimited", "infinity"):
            return value
        if not is_uint(value):
            raise HostFileError(path, number, f"{klass}: {cap}={value!r} is not a number, unlimited or infinity")
        return int(value)

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

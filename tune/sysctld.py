"""What the next boot does to a sysctl: the files systemd-sysctl and
procps `sysctl --system` read, in their order, under the host's root.

Both read *.conf from /etc/sysctl.d, /run/sysctl.d, /usr/local/lib/sysctl.d,
/usr/lib/sysctl.d and /lib/sysctl.d; a file name in an earlier directory
masks the same name in a later one (a link to /dev/null masks it away);
the files are applied in the order of their names, so the last assignment
of a key wins. procps then reads /etc/sysctl.conf last (Debian also links
it as /etc/sysctl.d/99-sysctl.conf, which is what systemd-sysctl sees).
Lines are `key = value`; `#` and `;` start comments; a leading `-` on the
key only silences errors; `/` may separate the parts; a glob sets only keys
that no line names explicitly.
tests/test_sysctl_boot.py checks these claims against both programs.
"""

import os
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from . import hostfiles

DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
LEGACY = "/etc/sysctl.conf"
MAX_LINKS = 8


@dataclass(frozen=True)
class Line:
    """One line of a boot file that concerns a key: an assignment, or a line boot ignores."""
    path: str
    number: int
    value: str | None       # None: not a `key = value` line
    text: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.number}"


def inside(host, path: Path) -> Path:
    """Follow symlinks as the booted host would: absolute targets stay under host.root."""
    for _ in range(MAX_LINKS):
        if not path.is_symlink():
            return path
        target = os.readlink(path)
        path = host.path(target) if target.startswith("/") else path.parent / target
    return path


def boot_files(host) -> list[Path]:
    """Every file the boot applies, in order (the name a user sees, not the link target)."""
    chosen: dict[str, Path] = {}
    for d in DIRS:
        directory = host.path(d)
        if not directory.is_dir():
            continue
        for f in sorted(directory.glob("*.conf")):
            chosen.setdefault(f.name, f)
    files = [chosen[n] for n in sorted(chosen) if not _masked(host, chosen[n])]
    legacy = host.path(LEGACY)
    if legacy.is_file():
        files.append(legacy)
    return files


def _masked(host, path: Path) -> bool:
    return path.is_symlink() and os.readlink(path) == "/dev/null" or not inside(host, path).is_file()


def normal(key: str) -> str:
    """net/core/somaxconn and -net.core.somaxconn are net.core.somaxconn."""
    key = key.strip().lstrip("-")
    if "/" in key:
        key = key.replace(".", "\0").replace("/", ".").replace("\0", "/")
    return key


def lines_for(host, key: str) -> list[Line]:
    """The lines of every boot file that set (or try to set) `key`, in the order boot applies them.
    A glob (net.core.*) counts only when no line names the key itself: both programs do so."""
    named, globbed = [], []
    for f in boot_files(host):
        for number, raw in hostfiles.lines(hostfiles.read(inside(host, f))):
            text = raw.strip()
            if not text or text[0] in "#;":
                continue
            name, eq, value = text.partition("=")
            pattern = normal(name) if eq else normal(text.split()[0])
            line = Line(str(f), number, value.strip() if eq else None, text)
            if pattern == key:
                named.append(line)
            elif eq and any(c in pattern for c in "*?[") and fnmatchcase(key, pattern):
                globbed.append(line)
    return named or globbed

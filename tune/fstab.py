"""Editing the options of one /etc/fstab entry, leaving every other byte alone.

Linux and FreeBSD share the format (device, mount point, type, options, ...),
so both mount backends use this.
"""

from pathlib import Path

ATIME_OPTIONS = ("noatime", "relatime", "strictatime", "atime", "norelatime")


def find_entry(text: str, mountpoint: str) -> int | None:
    """Index of the line whose second field is `mountpoint`."""
    for i, line in enumerate(text.splitlines()):
        fields = line.split()
        if fields and not fields[0].startswith("#") and len(fields) >= 4:
            if unescape(fields[1]) == mountpoint:
                return i
    return None


def check_entry(text: str, mountpoint: str, path) -> None:
    """Refuse an entry for `mountpoint` that mount(8) cannot use (fewer than 4 fields),
    naming FILE:LINE, instead of treating the mount as having no entry."""
    from .hostfiles import HostFileError
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if len(fields) in (2, 3) and not fields[0].startswith("#") and unescape(fields[1]) == mountpoint:
            raise HostFileError(path, number, f"fstab entry for {mountpoint} has {len(fields)} fields; "
                                "it needs at least 4 (device, mount point, type, options)")


def check_host(host, mountpoint: str) -> None:
    """check_entry on the host's /etc/fstab (both mount backends' at_boot)."""
    from .hostfiles import read
    path = host.path("/etc/fstab")
    check_entry(read(path) or "", mountpoint, path)


def options_of(text: str, mountpoint: str) -> list[str] | None:
    i = find_entry(text, mountpoint)
    return None if i is None else text.splitlines()[i].split()[3].split(",")


def set_atime(text: str, mountpoint: str, flag: str) -> str | None:
    """fstab text with the entry's atime option set to `flag`; None when no entry."""
    i = find_entry(text, mountpoint)
    if i is None:
        return None
    lines = text.splitlines(keepends=True)
    line = lines[i]
    fields = line.split()
    opts = [o for o in fields[3].split(",") if o not in ATIME_OPTIONS and o != "defaults"]
    if fields[3].split(",")[0] == "defaults":
        opts.insert(0, "defaults")
    opts.append(flag)
    start = _field_start(line, 3)
    end = start + len(fields[3])
    lines[i] = line[:start] + ",".join(opts) + line[end:]
    return "".join(lines)


def _field_start(line: str, n: int) -> int:
    pos, count, in_field = 0, -1, False
    for pos, ch in enumerate(line):
        if not ch.isspace() and not in_field:
            count += 1
            in_field = True
            if count == n:
                return pos
        elif ch.isspace():
            in_field = False
    raise ValueError("fstab line has too few fields")


def unescape(field: str) -> str:
    """fstab and mountinfo write spaces in paths as octal \\040."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")


def persist_edits(host, flags: dict[str, str]) -> list[tuple[Path, str]]:
    """File edits setting each mount point's atime flag in the host's fstab,
    with a backup of the old fstab beside it; none when nothing changes."""
    from .hostfiles import read
    path = host.path("/etc/fstab")
    text = read(path)
    if text is None:
        return []
    new = text
    for mountpoint, flag in flags.items():
        new = set_atime(new, mountpoint, flag) or new
    return [] if new == text else [(host.path("/etc/fstab.proxytune.bak"), text), (path, new)]

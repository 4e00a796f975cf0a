"""The raw device `bench storage --device` overwrites, and the proof it holds nothing.

A device is refused (one line, exit 2) when it is not a block device, is in
use (mounted, swap, held by dm/md/LVM, or open O_EXCL by another process), or
holds data: a signature wipefs knows, or any non-zero byte in the first and
last MiB and in blocks spread evenly between them (the midpoint included).
Data without a signature (plain dm-crypt, a raw database volume, text) is
found by the reads. --force-destroy-data overrides the data checks only:
writing under a mounted filesystem or another holder is never right.

The device is opened O_EXCL before the checks and held until the run ends,
so nothing can mount or claim it in between (our own writers open it
without O_EXCL, which O_EXCL permits).
"""

import contextlib
import errno
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from proxytune.core.errors import ProxytuneError
from proxytune.core.numbers import is_uint

MIB = 1 << 20
SAMPLE_BLOCKS = 65          # 1 MiB each, evenly spaced between the first and last MiB; odd, so the midpoint is one
FORCE_HINT = "pick an unused device, or pass --force-destroy-data if its contents may be destroyed"


@dataclass
class Claimed:
    path: str                           # the device node, symlinks resolved
    given: str                          # as the user named it
    size: int
    checked_bytes: int = 0
    notes: list[str] = field(default_factory=list)


def _shown(dev: str) -> str:
    return repr(dev) if not dev.isprintable() or not dev.strip() else dev


def resolve(dev: str) -> tuple[str, str | None]:
    """The block device node `dev` names, and a note when it was reached through a symlink."""
    if not dev or not dev.strip():
        raise ProxytuneError("--device is empty", "name a block device (e.g. /dev/sdb), or leave --device out "
                                                  "to bench a loop device over a sparse file")
    if not dev.isprintable():
        raise ProxytuneError(f"--device {_shown(dev)} contains control characters")
    try:
        st = os.stat(dev)
    except FileNotFoundError:
        raise ProxytuneError(f"--device {dev} does not exist") from None
    except OSError as e:
        raise ProxytuneError(f"--device {dev}: {e.strerror}") from None
    real = os.path.realpath(dev)
    via = f"{dev} is a symlink to {real}" if real != os.path.abspath(dev) else None
    if not stat.S_ISBLK(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a regular file" if stat.S_ISREG(st.st_mode) \
            else "a character device" if stat.S_ISCHR(st.st_mode) else "not a device"
        raise ProxytuneError(f"--device {dev} is not a block device: it is {kind}" + (f" ({real})" if via else ""),
                             "bench storage --device writes to a whole block device, e.g. /dev/sdb")
    return real, via


def unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return path.encode().decode("unicode_escape") if "\\" in path else path


def in_use(real: str) -> list[str]:
    """Why the device is in use: mounted (itself or a partition), swap, or held by dm/md/LVM."""
    st = os.stat(real)
    name = Path(real).name
    majmin = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    problems = [f"{real} is mounted on {unescape(f[4])}" for f in
                (line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()) if f[2] == majmin]
    if any(line.split()[0] == real for line in Path("/proc/swaps").read_text().splitlines()[1:]):
        problems.append(f"{real} is in use as swap")
    sysdir = Path("/sys/class/block") / name
    holders = sorted(p.name for p in (sysdir / "holders").glob("*")) if sysdir.exists() else []
    if holders:
        problems.append(f"{real} is held by {', '.join(holders)} (LVM, md or dm)")
    for child in sorted(p.name for p in sysdir.glob(f"{name}*")) if sysdir.exists() else []:
        if os.path.exists(f"/dev/{child}"):
            problems += [p.replace(f"/dev/{child}", f"its partition /dev/{child}") for p in in_use(f"/dev/{child}")]
    return problems


def openers(rdev: int) -> list[str]:
    """'PID (comm)' of every process with the device open (which of them holds O_EXCL is not visible)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not is_uint(proc.name) or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    st = fd.stat()
                    if stat.S_ISBLK(st.st_mode) and st.st_rdev == rdev:
                        comm = (proc / "comm").read_text().strip()
                        out.append(f"{proc.name} ({comm if comm.isprintable() else repr(comm)})")
                        break
    return out


def open_exclusive(real: str) -> int:
    """O_EXCL on a block device: fails with EBUSY while it is mounted or another holder has it."""
    try:
        return os.open(real, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
    except OSError as e:
        if e.errno != errno.EBUSY:
            raise ProxytuneError(f"cannot open {real}: {e.strerror}") from None
        who = openers(os.stat(real).st_rdev)
        raise ProxytuneError(f"refusing to write to {real}: it is held open exclusively by another process"
                             + (f" (open in pid {', '.join(who)})" if who else ""),
                             "pick an unused device; --force-destroy-data does not override this") from None


def signatures(real: str) -> list[str]:
    if not shutil.which("wipefs"):
        raise ProxytuneError("wipefs is not installed: cannot look for signatures", "Debian: apt-get install util-linux")
    p = subprocess.run(["wipefs", "--no-act", "--noheadings", "--output", "TYPE", real], capture_output=True, text=True)
    if p.returncode != 0:
        raise ProxytuneError(f"cannot read {real}'s signatures (wipefs: {p.stderr.strip()[-80:]})")
    return sorted({t.strip() for t in p.stdout.splitlines() if t.strip()})


def sample_offsets(size: int) -> list[tuple[int, int]]:
    """(offset, length) of the reads: all of a small device; else first MiB, last MiB, and the blocks between."""
    if size <= (SAMPLE_BLOCKS + 2) * MIB:
        return [(off, min(MIB, size - off)) for off in range(0, size, MIB)]
    span = size - 3 * MIB                       # where a block between the first and last MiB can start
    between = [MIB + (span * i // (SAMPLE_BLOCKS - 1)) // 4096 * 4096 for i in range(SAMPLE_BLOCKS)]
    return [(0, MIB)] + [(off, MIB) for off in between] + [(size - MIB, MIB)]


def first_data(fd: int, size: int) -> tuple[int | None, int]:
    """Offset of the first non-zero byte among the sampled reads (None: all blank), and bytes read."""
    read = 0
    for off, length in sample_offsets(size):
        buf = os.pread(fd, length, off)
        read += len(buf)
        rest = buf.lstrip(b"\0")
        if rest:
            return off + len(buf) - len(rest), read
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return None, read


def data_problem(fd: int, real: str, size: int) -> tuple[str | None, int]:
    """Why the device's contents look like data, and how many bytes were checked."""
    sigs = signatures(real)
    if sigs:
        return f"it carries a signature ({', '.join(sigs)}): it holds a filesystem or partition table", 0
    where, read = first_data(fd, size)
    if where is not None:
        return f"it holds data: byte {where} (at {where / MIB:.1f} MiB of {size / MIB:.0f} MiB) is not zero", read
    return None, read


@contextlib.contextmanager
def claim(dev: str, force: bool):
    """Hold `dev` O_EXCL for the `with` block, after proving it unused and (unless forced) blank."""
    real, via = resolve(dev)
    name = f"{dev} (a symlink to {real})" if via else dev
    problems = in_use(real)
    if problems:
        raise ProxytuneError(f"refusing to write to {name}: {problems[0]}",
                             "pick an unused device; --force-destroy-data does not override this")
    fd = open_exclusive(real)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        if size == 0:
            raise ProxytuneError(f"--device {name} has size 0: no medium, or a loop device with nothing bound")
        claimed = Claimed(real, dev, size, notes=[via] if via else [])
        why, claimed.checked_bytes = data_problem(fd, real, size)
        if why and not force:
            raise ProxytuneError(f"refusing to write to {name}: {why}", FORCE_HINT)
        if why:
            claimed.notes.append(f"--force-destroy-data: overwriting although {why}")
        yield claimed
    finally:
        os.close(fd)

"""Build the C harnesses with cc, cached: rebuilt only when a source, the
flags or the compiler change. Binaries live in the user's cache directory
(tune.datafiles.cache_dir: private, every parent vetted), never next to
installed code; a cached binary that is not ours is rebuilt, never run.

The compiler and its flags are core.cc's (warnings are errors only when
PROXYTUNE_WERROR=1: the tests set it)."""

import hashlib
import os
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from proxytune.core import cc
from proxytune.core.errors import ProxytuneError
from proxytune.tune.datafiles import cache_dir, shipped

from .runner import HarnessError

STALE_S = 86400
LIBURING_HEADER = Path("/usr/include/liburing.h")

@dataclass(frozen=True)
class Harness:
    """One C harness: its sources (every .c and .h of microbench/DIRECTORY, shipped as data), the flags
    and libraries it needs, and whether it uses liburing when the host has its header. Each measurement
    module declares its own (events.HARNESS, ...); reports/measurements.py names it in the measurement's
    spec, which packaging and the tests iterate."""
    name: str                                   # the binary's name in the build cache
    directory: str                              # microbench/DIRECTORY holds its sources
    flags: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()
    uring: bool = False                         # -DHAVE_LIBURING and -luring when liburing.h is there

    def flags_here(self) -> tuple[list[str], list[str]]:
        """(extra compiler flags, libraries) on this host."""
        extra, libs = list(self.flags), []
        if self.uring and LIBURING_HEADER.exists():
            extra.append("-DHAVE_LIBURING")
            libs.append("-luring")
        return extra, libs + list(self.libraries)


def compiler() -> str:
    """core.cc's compiler; its absence makes the harness unavailable, as any other build failure."""
    try:
        return cc.compiler()
    except cc.NoCompiler as e:
        raise HarnessError(e.message, e.hint) from None


cflags = cc.cflags


def build(harness: Harness) -> Path:
    """Path to the built harness, compiling it first if anything changed."""
    name = harness.name
    src_dir = shipped("microbench", harness.directory)
    sources = sorted(src_dir.glob("*.c"))
    headers = sorted(src_dir.glob("*.h"))
    extra, libs = harness.flags_here()
    cc = compiler()
    key = hashlib.sha256()
    for f in sources + headers:
        key.update(f.name.encode() + f.read_bytes())
    flags = cflags()
    key.update(" ".join([cc] + flags + extra + libs).encode())
    key.update(subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.encode())
    try:
        build_dir = cache_dir()
    except ProxytuneError as e:        # a refused cache: the bench is unavailable, its JSON still written
        raise HarnessError(e.message, e.hint) from None
    out = build_dir / f"{name}-{key.hexdigest()[:12]}"
    if _ours(out):
        return out
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=build_dir)
    except OSError as e:
        raise HarnessError(f"cannot build {name}: the build cache {build_dir} is not writable ({e.strerror})",
                           "set PROXYTUNE_CACHE_DIR to a writable directory") from None
    os.close(fd)
    cmd = [cc, *flags, *extra, "-o", tmp, *map(str, sources), *libs]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
            why = "; ".join(lines[-2:]) if lines else f"{cc} exited {proc.returncode} and said nothing"
            raise HarnessError(f"building {name} failed: {why}", " ".join(cmd))
        if os.path.getsize(tmp) == 0:       # a "compiler" that exits 0 without writing a program
            raise HarnessError(f"building {name} failed: {cc} exited 0 but wrote no program", " ".join(cmd))
        os.replace(tmp, out)    # atomic: a concurrent run sees no half-written binary
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _remove_stale(build_dir, name, out)
    return out


def _ours(binary: Path) -> bool:
    """A cached build we made and no one else can change; anything else there is removed (and rebuilt):
    root runs it."""
    try:
        st = os.lstat(binary)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
        return True
    binary.unlink()
    return False


def _remove_stale(build_dir: Path, name: str, keep: Path) -> None:
    """Old builds of this harness, left a day: another run may still use a recent one."""
    for old in build_dir.glob(f"{name}-*"):
        try:
            if old != keep and time.time() - old.stat().st_mtime > STALE_S:
                old.unlink()
        except OSError:
            pass

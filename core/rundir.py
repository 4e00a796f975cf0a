"""One private temp directory per run, gone on every way out.

Everything a run writes for itself (bpftrace programs, perf.data with copies
of user stacks, cachegrind output, the storage bench's images and mount
points) goes into one directory, 0700, made with mkdtemp. It is removed in
`finally`, on SIGTERM/SIGHUP (turned into KeyboardInterrupt so the `finally`
runs) and with those signals and SIGINT held back while it is removed.

Only SIGKILL (or a power cut) skips that. So the directory carries an owner
file (pid, start time, boot id): the next run of the same kind removes the
directories whose owner is provably gone, after killing the processes the dead
run left working in them. Nothing without a valid owner file, not owned by us,
or writable by others is touched.
"""

import contextlib
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path

from proxytune.core.errors import ProxytuneError

from . import procfs, signals

PREFIX = "proxytune-"
OWNER = "owner"
HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def signals_held():
    """Hold back Ctrl-C and termination while cleaning up; they are delivered afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class RunDir:
    """`with RunDir("probe") as d:` d.path is private to this run and removed on leaving."""

    def __init__(self, kind: str, before_remove=None):
        self.kind = kind
        self.before_remove = before_remove      # called with a dead run's dir before it is removed
        self.path: Path | None = None
        self.reaped: list[str] = []
        self._old = {}

    def __enter__(self):
        self.reaped = reap_dead(self.kind, self.before_remove)
        if threading.current_thread() is threading.main_thread():      # handlers can only be set there
            self._old = signals.catch((signal.SIGTERM, signal.SIGHUP), _interrupt)
        try:
            self.path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{self.kind}-"))
            me = procfs.read_stat(os.getpid())
            tmp = self.path / f".{OWNER}"
            tmp.write_text(f"{os.getpid()} {me.start if me else 0} {boot_id()}\n")
            tmp.rename(self.path / OWNER)
        except OSError as e:
            self.__exit__(None, None, None)
            raise ProxytuneError(f"cannot make this run's temp dir in {tempfile.gettempdir()}: {e.strerror}",
                                 "free some space there, or point TMPDIR elsewhere") from None
        return self

    def __exit__(self, *exc):
        with signals_held():
            self.remove()
            for sig, handler in self._old.items():
                signal.signal(sig, handler)
        return False

    def remove(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)


class InRunDir:
    """Base of what owns a RunDir and something to undo in it (tracer processes, loop mounts):
    `with` enters the dir (self.dir); leaving runs close() with signals held, then removes the dir."""

    def __init__(self, kind: str, before_remove=None):
        self.run = RunDir(kind, before_remove)
        self.dir: Path | None = None

    @property
    def reaped(self) -> list[str]:
        return self.run.reaped

    def __enter__(self):
        self.run.__enter__()
        self.dir = self.run.path
        return self

    def __exit__(self, *exc):
        with signals_held():
            self.close()
        return self.run.__exit__(*exc)

    def close(self) -> None:
        raise NotImplementedError


def read_owner(d: Path) -> tuple[int, int, str] | None:
    """(pid, start, boot id) of a run dir we made, or None if it is not provably ours."""
    try:
        st = d.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        fd = os.open(d / OWNER, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as fh:
            if os.fstat(fh.fileno()).st_uid != os.geteuid():
                return None
            pid, start, boot = fh.read(200).split()
        return int(pid), int(start), boot
    except (OSError, ValueError):
        return None


def is_dead(owner: tuple[int, int, str]) -> bool:
    pid, start, boot = owner
    return boot != boot_id() or not procfs.alive(pid, start)


def dead_runs(kind: str) -> list[tuple[Path, tuple[int, int, str]]]:
    out = []
    for d in sorted(Path(tempfile.gettempdir()).glob(f"{PREFIX}{kind}-*")):
        owner = read_owner(d)
        if owner and is_dead(owner):
            out.append((d, owner))
    return out


def orphans(d: Path, owner: tuple[int, int, str]) -> list[int]:
    """Processes a dead run left working in d: ours (same uid), started after it, naming d in argv or cwd."""
    mark = os.fsencode(f"{d}/")
    found = []
    for pid in procfs.all_pids():
        entry = Path(f"/proc/{pid}")
        if pid == os.getpid():
            continue
        st = procfs.read_stat(pid)
        if st is None or st.start < owner[1] or owner[2] != boot_id():
            continue
        try:
            if entry.stat().st_uid != os.geteuid():
                continue
            argv = (entry / "cmdline").read_bytes()
            cwd = os.fsencode(os.readlink(entry / "cwd")) + b"/"
        except OSError:
            continue
        if mark in argv.replace(b"\0", b" ") or cwd.startswith(mark):
            found.append(st.pid)
    return found


def kill_orphans(d: Path, owner: tuple[int, int, str]) -> list[int]:
    pids = orphans(d, owner)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.05)
    return pids


def _running(pid: int) -> bool:
    st = procfs.read_stat(pid)
    return st is not None and not st.gone


def reap_dead(kind: str, before_remove=None) -> list[str]:
    """Remove what killed runs of this kind left; one line per run saying what went."""
    said = []
    for d, owner in dead_runs(kind):
        killed = kill_orphans(d, owner)
        extra = before_remove(d) if before_remove else []
        shutil.rmtree(d, ignore_errors=True)
        what = ([f"killed its processes {', '.join(map(str, killed))}"] if killed else []) + list(extra)
        said.append(f"removed {d}, left by a killed run (pid {owner[0]})" + (f": {'; '.join(what)}" if what else ""))
    return said

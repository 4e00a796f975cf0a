"""Every file root reads on a watched process's behalf (its config, the
files the config names, its logs), read the way that process would read
it: by a short-lived reader running with the target's uid, gid and groups
(so the kernel decides what it may see, and a symlink to a root-only file
is refused, never shown), relative paths from the target's cwd, regular
files only (opened O_NONBLOCK, so a FIFO never blocks), at most
MAX_BYTES, within READ_SECONDS. The reader is a forked child that drops
to the target's credentials for good and only opens, reads and writes a
pipe; the doctor itself never changes its own.

    got = read(pid, "squid.conf")              # Read(path, text, size, why)
    got = read(pid, log, start=size_before)     # what was appended since
"""

import ctypes
import os
import re
import select
import signal
import stat
import time
from dataclasses import dataclass

MAX_BYTES = 4 << 20         # per file: more than any real proxy config, far less than memory
READ_SECONDS = 5.0          # a reader that takes longer (a hung network filesystem) is killed
HELD = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
PR_SET_DUMPABLE = 4
LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Read:
    path: str | None            # as the target names it ("cwd of pid N/x" for a relative one)
    text: str | None            # None: not read, `why` says why
    size: int | None = None     # the file's size when read (a log's offset for the next read)
    why: str | None = None


@dataclass(frozen=True)
class Creds:
    uid: int
    gid: int
    groups: tuple[int, ...]


def creds_of(pid: int, proc: int | None = None) -> Creds | None:
    """The filesystem uid/gid and groups the kernel checks the target's file access with
    (read through `proc`, an open /proc/PID directory, when given)."""
    try:
        text = _proc_text(proc, "status") if proc is not None else _proc_text(None, f"/proc/{int(pid)}/status")
    except (OSError, ValueError):
        return None
    uid = re.search(r"^Uid:\s+[0-9]+\s+[0-9]+\s+[0-9]+\s+([0-9]+)", text, re.M | re.A)
    gid = re.search(r"^Gid:\s+[0-9]+\s+[0-9]+\s+[0-9]+\s+([0-9]+)", text, re.M | re.A)
    groups = re.search(r"^Groups:([0-9 \t]*)$", text, re.M | re.A)
    if not (uid and gid and groups):
        return None
    return Creds(int(uid.group(1)), int(gid.group(1)), tuple(int(g) for g in groups.group(1).split()))


def _proc_text(proc: int | None, name: str) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    with os.fdopen(fd, encoding="ascii", errors="replace") as fh:
        return fh.read(1 << 16)


def run_as(pid: int, proc: int | None = None) -> dict | None:
    """subprocess arguments that run a helper (varnishstat) with pid's credentials (read through `proc`,
    its open /proc/PID, when given: never a recycled pid's); None when pid is gone."""
    creds = creds_of(pid, proc)
    if creds is None:
        return None
    if os.geteuid() != 0:
        return {}
    return {"user": creds.uid, "group": creds.gid, "extra_groups": list(creds.groups)}


def _become(creds: Creds, keep: tuple[int, ...]) -> None:
    """In the reader: shed what is root's and would be reachable through /proc/self (its open
    fds, its cwd, its memory and environment, readable to a dumpable process), then take the
    target's groups, gid and uid for good (we can only when root)."""
    for lo, hi in zip((3, *(k + 1 for k in sorted(keep))), (*sorted(keep), os.sysconf("SC_OPEN_MAX"))):
        os.closerange(lo, hi)
    os.chdir("/")
    if os.geteuid() == 0:
        os.setgroups(list(creds.groups))
        os.setresgid(creds.gid, creds.gid, creds.gid)
        os.setresuid(creds.uid, creds.uid, creds.uid)
    if LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:       # whatever fs.suid_dumpable says
        raise OSError(ctypes.get_errno(), "cannot make the reader non-dumpable")


def _reader(out: int, dirfd: int, path: str, start: int, cap: int, creds: Creds) -> None:
    """The child: open as the target (O_NONBLOCK: a FIFO opens at once), regular files only,
    write 'SIZE\\n' and at most `cap` bytes from `start` to `out`, none past SIZE (a writer may append
    while we read: SIZE is then exactly where the next read from it starts); 'ERR why' on failure."""
    try:
        _become(creds, (out, dirfd))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dirfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "it is not a regular file")
        pos = max(st.st_size + start, 0) if start < 0 else (start if start <= st.st_size else 0)
        os.lseek(fd, pos, 0)
        os.write(out, b"%d\n" % st.st_size)
        cap = min(cap, st.st_size - pos)
        while cap > 0 and (block := os.read(fd, min(cap, 1 << 16))):
            os.write(out, block)
            cap -= len(block)
    except OSError as e:
        os.write(out, b"ERR " + (e.strerror or str(e)).encode(errors="replace")[:200])


def _collect(r: int, cap: int) -> bytes | None:
    """Everything the reader writes (at most cap + a header), or None past READ_SECONDS."""
    end, data = time.monotonic() + READ_SECONDS, bytearray()
    waiter = select.poll()              # not select(): a doctor in a process holding 1,024 descriptors
    waiter.register(r, select.POLLIN)   # gets pipes numbered past FD_SETSIZE (a benchmark's idle clients)
    while len(data) <= cap + 64:
        left = end - time.monotonic()
        if left <= 0 or not waiter.poll(left * 1000):
            return None
        block = os.read(r, 1 << 16)
        if not block:
            break
        data += block
    return bytes(data)


def _run_reader(dirfd: int, path: str, start: int, cap: int, creds: Creds) -> bytes | None:
    r, w = os.pipe()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)      # the child never runs the doctor's handlers
    try:
        pid = os.fork()
        if pid == 0:                            # the child never returns into the doctor
            try:
                os.close(r)
                _reader(w, dirfd, path, start, cap, creds)
            finally:
                os._exit(0)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    os.close(w)
    try:
        return _collect(r, cap)
    finally:
        os.close(r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def shown_path(pid: int, path: str) -> str:
    return path if path.startswith("/") else f"{path} (in the cwd of pid {pid})"


def read(pid: int, path: str | None, start: int = 0, cap: int = MAX_BYTES, proc: int | None = None) -> Read:
    """The file `path` as pid would read it, from byte `start` (past the end: from 0, the file was
    rotated; negative: the last -start bytes), at most `cap` bytes, decoded with replacement.
    proc: /proc/PID opened when the process was found (open_proc): its credentials and cwd are read
    through it, and it stops answering once that process exits, so a pid recycled since (maybe by a
    root process with another cwd) is never read as."""
    if not path or "\0" in path or any(ord(c) < 32 for c in path):
        return Read(None, None, why="no usable path")
    shown = shown_path(pid, path)
    mine = proc is None and (proc := open_proc(pid)) is not None
    if proc is None:
        return Read(shown, None, why=f"pid {pid} has exited")
    try:
        return _read_through(proc, pid, path, shown, start, cap)
    finally:
        if mine:
            os.close(proc)


def open_proc(pid: int) -> int | None:
    """An fd of /proc/PID that stays this process's: reads through it fail once it exits."""
    try:
        return os.open(f"/proc/{int(pid)}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None


def _read_through(proc: int, pid: int, path: str, shown: str, start: int, cap: int) -> Read:
    creds = creds_of(pid, proc)
    if creds is None:
        return Read(shown, None, why=f"pid {pid} has exited")
    try:
        cwd = os.open("cwd" if not path.startswith("/") else "/", os.O_PATH | os.O_DIRECTORY, dir_fd=proc)
    except OSError as e:
        return Read(shown, None, why=f"the cwd of pid {pid}: {e.strerror}")
    try:
        raw = _run_reader(cwd, path, int(start), int(cap), creds)
    finally:
        os.close(cwd)
    if raw is None:
        return Read(shown, None, why=f"reading it took over {READ_SECONDS:g} s")
    head, _, body = raw.partition(b"\n")
    if not re.fullmatch(rb"[0-9]+", head, re.A):
        why = raw.removeprefix(b"ERR ").decode(errors="replace") or "the reader died"
        return Read(shown, None, why=f"cannot read it as uid {creds.uid}: {why}")
    return Read(shown, body.decode(errors="replace"), int(head), None)

"""A mount namespace of the calling process's own, and filesystems mounted only there.

Why: a benchmark that mounts a fresh filesystem for a proxy's cache (microbench/proxysides.py)
must leave nothing on the host, not even when it is killed: mounts made in a private mount
namespace (mount_namespaces(7), propagation private) are never seen outside it and go away with
its last process; a loop device mounted there is detached then (its autoclear flag, set by mount).
A server that drops its privileges (Squid, nginx's workers) loses its parent-death signal
(PR_SET_PDEATHSIG is cleared on a credential change: prctl(2)) and would outlive a SIGKILLed
benchmark, keeping the namespace and its mounts alive: guard() kills what is left in it.
"""

import ctypes
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .errors import ProxytuneError
from .numbers import is_uint

CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def private() -> None:
    """This process into a mount namespace of its own, nothing propagated back to the host. Before
    any thread starts: unshare(CLONE_NEWNS) unshares the filesystem context, which a process with
    threads cannot."""
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0 or libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        e = ctypes.get_errno()
        raise ProxytuneError(f"a private mount namespace: {os.strerror(e)}")


def guard() -> None:
    """Fork a guard that outlives this process by a moment: when it ends, however (a SIGKILL too),
    the guard kills every other process still in this mount namespace, and so the namespace, its
    mounts and their loop devices go. In a session of its own (a kill of our process group does
    not reach it), with no descriptor of ours (a pipe read to its end would wait for it). Call it
    after private(), while this process has no thread (fork copies only the caller)."""
    parent, ns = os.getpid(), os.readlink("/proc/self/ns/mnt")
    if os.fork() != 0:
        return
    try:                                  # the guard: never returns into the caller's code
        os.setsid()
        os.closerange(0, os.sysconf("SC_OPEN_MAX"))
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        _libc().prctl(PR_SET_PDEATHSIG, int(signal.SIGUSR1), 0, 0, 0)     # told when the parent ends
        if os.getppid() == parent:                             # else it ended already
            signal.sigwait({signal.SIGUSR1})
        for _ in range(200):              # 10 s at most: one stuck in the kernel (D state) is not waited out
            if not _kill_all_in(ns):
                break
    finally:
        os._exit(0)


def _kill_all_in(ns: str) -> bool:
    """SIGKILL every process in mount namespace `ns` but this one; whether there was any."""
    found = False
    for entry in os.scandir("/proc"):
        if not is_uint(entry.name) or int(entry.name) == os.getpid():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/ns/mnt") == ns:
                os.kill(int(entry.name), signal.SIGKILL)
                found = True
        except OSError:                   # gone meanwhile, or a kernel thread
            continue
    if found:
        time.sleep(0.05)                  # their exits take a moment: look again after it
    return found


def _run(argv: list[str]) -> None:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise ProxytuneError(f"{argv[0]} failed: {(p.stderr or p.stdout).strip()[-200:]}")


def fresh_ext4(image: Path, size_mb: int, where: Path, owner: str) -> None:
    """A new ext4 in a sparse image file, mounted at `where` through a loop device, its root owned
    by `owner`: empty, with no history of deleted inodes (ext4's allocator searches past recently
    deleted ones: a cache on a long-used filesystem pays that in the kernel)."""
    with open(image, "wb") as fh:
        fh.truncate(int(size_mb) << 20)
    _run(["mkfs.ext4", "-q", "-F", str(image)])
    _run(["mount", "-o", "loop,noinit_itable", str(image), str(where)])
    shutil.chown(where, owner, owner)


def detach(where: Path) -> None:
    """Unmount lazily (the namespace's last process may still hold a file there); never raises."""
    _libc().umount2(str(where).encode(), MNT_DETACH)

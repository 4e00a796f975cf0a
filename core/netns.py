"""Run a function in a forked child inside a new network namespace with only loopback up.

Why: the report measures a proxy before and after a profile's net.* settings without
touching the host. net.* sysctls under /proc/sys/net belong to the namespace that opens them
(Documentation/admin-guide/sysctl/net.rst; namespaces(7)), so written in a private namespace
they change nothing outside it, and a proxy started there cannot send a packet off the host:
its only interface is lo. The child dies with us (PR_SET_PDEATHSIG) and its result comes back
as JSON over a pipe; an exception in it comes back as its message.
"""

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import threading
import traceback

from . import procgroup
from .errors import ProxytuneError

CLONE_NEWNET = 0x40000000


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _interrupt_once(signum, frame):
    """Ctrl-C stops the child's work once; a second SIGINT (the parent passing it on) must not
    cut short the cleanup that stops the servers it started."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _enter_private_netns() -> None:
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:     # ignored (a script's background job): so here too
        signal.signal(signal.SIGINT, _interrupt_once)
    procgroup.die_with_parent()
    libc = _libc()
    if libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def _parent_interrupted_once():
    """The parent too takes Ctrl-C once while its child runs: a terminal sends SIGINT to both, and a
    second one (an impatient user) raised while the parent is on its way into _stop would end the
    parent, and PR_SET_PDEATHSIG would then SIGKILL the child in the middle of its cleanup. The
    handler itself switches to ignore, so there is no window between the two."""
    ours = (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if ours:
        signal.signal(signal.SIGINT, _interrupt_once)
    try:
        yield
    finally:
        if ours:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def call(fn, *args, **kwargs):
    """fn(*args, **kwargs) in a private network namespace; its JSON-able result, or ProxytuneError."""
    with _parent_interrupted_once():
        return _call(fn, *args, **kwargs)


def _call(fn, *args, **kwargs):
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: never returns into the caller's code
        os.close(rd)
        code = 0
        try:
            _enter_private_netns()
            out = {"ok": fn(*args, **kwargs)}
        except ProxytuneError as e:
            out, code = {"error": e.message}, 1
        except BaseException as e:                 # noqa: BLE001 - reported to the parent, which decides
            out, code = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}, 1
        try:
            with os.fdopen(wr, "w") as f:
                json.dump(out, f, default=str)
        finally:
            os._exit(code)
    os.close(wr)
    try:
        with os.fdopen(rd) as f:
            text = f.read()
        os.waitpid(pid, 0)
    except BaseException:
        _stop(pid)
        raise
    try:
        out = json.loads(text)
    except ValueError:
        raise ProxytuneError("the private-namespace run died before it answered") from None
    if "error" in out:
        raise ProxytuneError(f"in a private network namespace: {out['error']}")
    return out["ok"]


def _stop(pid: int, grace: float = 20.0) -> None:
    """On Ctrl-C the child got SIGINT too (or gets it now) and stops its own servers: give it that
    time, then kill it, so nothing it started is left behind or left running."""
    import time
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(KeyboardInterrupt):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return
            time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def run_in(pid: int, fn):
    """fn() on a short-lived thread inside pid's network namespace (setns(2) moves the calling thread
    only, so no other thread of ours leaves its namespace): what it opens there (a socket, a file under
    /proc/sys/net) belongs to that namespace and stays so after. Its result, or the OSError it raised
    (also when the namespace cannot be entered: the process is gone, or CAP_SYS_ADMIN is missing).
    In pid's namespace already (a proxy on the host, pid None for ours), fn() runs here: no thread."""
    if pid is None:
        return fn()
    got: dict = {}
    target = os.open(f"/proc/{int(pid)}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        theirs, ours = os.fstat(target), os.stat("/proc/thread-self/ns/net")
    except OSError:
        os.close(target)
        raise
    if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
        os.close(target)
        return fn()

    def enter_and_run():
        try:
            if _libc().setns(target, CLONE_NEWNET) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"setns into the network namespace of pid {pid}: {os.strerror(e)}")
            got["result"] = fn()
        except OSError as e:
            got["error"] = e

    try:
        t = threading.Thread(target=enter_and_run, name="netns-enter")
        t.start()
        t.join()
    finally:
        os.close(target)
    if "error" in got:
        raise got["error"]
    return got["result"]


def current() -> int:
    """A descriptor of the calling thread's network namespace (close it when done): enter() goes back."""
    return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)


def another() -> int:
    """A new private namespace with only loopback up, which the calling thread is moved into; a
    descriptor of it. For a process already in a private namespace (call()) that keeps two: the
    before and after sides of a comparison, each with its own net.* values (microbench/proxysides.py)."""
    if _libc().unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, capture_output=True, timeout=10)
    return current()


def enter(fd: int) -> None:
    """Move the calling thread into the namespace of fd (setns(2)): what it opens or starts from then
    on (sockets, /proc/sys/net files, child processes, threads) belongs to that namespace."""
    if _libc().setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"setns into a network namespace: {os.strerror(e)}")

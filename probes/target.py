"""Is this pid a process we can watch, and is it still the same process?

A probe window is only meaningful on a live user process: a zombie has no
address space or fds left, a kernel thread has no rlimits or user stack worth
a finding, and a pid that is exiting will be gone (or recycled) before the
window ends. Each is refused with one line. A process is its pid plus its
start time (field 22 of /proc/PID/stat), so a pid recycled mid-window is
seen as the original process having exited.
"""

import math
import os
import time

from proxytune.core.capability import Capability, no, yes
from proxytune.core.errors import ProxytuneError
from proxytune.core.procfs import ProcStat, alive, read_stat

MAX_SECONDS = 300.0         # a window longer than this fills the disk with perf samples and is never what one wants
PF_EXITING = 0x00000004     # include/linux/sched.h
PF_KTHREAD = 0x00200000
KTHREADD = 2                # every kernel thread is kthreadd or its child


def shown(name: str) -> str:
    """A process name as one printable line: anyone can set their comm to control characters."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in name)


def watch_capability(st: ProcStat) -> Capability:
    """Whether this process can be watched, and why not."""
    if st.gone:
        return no("it is a zombie (exited, not yet reaped): nothing left to watch")
    if st.flags & PF_KTHREAD or st.pid == KTHREADD or st.ppid == KTHREADD:
        return no("it is a kernel thread: doctor and probes watch user processes")
    if st.flags & PF_EXITING:
        return no("it is exiting")
    try:
        os.readlink(f"/proc/{st.pid}/exe")
    except FileNotFoundError:
        return no("it has no executable any more (exiting)")
    except OSError:
        pass                # EACCES: another user's process; not ours to judge here
    return yes("it can be watched")


def why_not(pid: int) -> str:
    """Why pid cannot be watched (it may have exited meanwhile)."""
    st = read_stat(pid)
    if st is None:
        return f"pid {pid} has exited"
    return f"pid {pid} ({shown(st.comm)}): {watch_capability(st).why}"


def check(pid: int) -> ProcStat:
    """The stat of a watchable pid; ProxytuneError (one line) otherwise."""
    if pid <= 0:
        raise ProxytuneError(f"--pid must be a positive process id, not {pid}")
    st = read_stat(pid)
    if st is None:
        raise ProxytuneError(f"no process with pid {pid}", "list them with: ps -e -o pid,comm")
    can = watch_capability(st)
    if not can.ok:
        raise ProxytuneError(f"refusing to watch pid {pid} ({shown(st.comm)}): {can.why}",
                             "pick a running user process: ps -e -o pid,stat,comm")
    return st


def watchable(pids: list[int]) -> list[int]:
    """The pids that are live user processes (kernel threads, zombies and the exiting left out)."""
    return [p for p in pids if (st := read_stat(p)) is not None and watch_capability(st).ok]


def start_times(pids: list[int]) -> dict[int, int]:
    """pid -> start time, taken when the window opens."""
    return {p: st.start for p in pids if (st := read_stat(p)) is not None}


def duration(value) -> float:
    """A window length in seconds: a finite number in (0, MAX_SECONDS]; one line otherwise."""
    try:
        s = float(value)
    except (TypeError, ValueError):
        raise ProxytuneError(f"--duration must be a number of seconds, not {value!r}") from None
    if not math.isfinite(s) or not 0 < s <= MAX_SECONDS:
        raise ProxytuneError(f"--duration must be more than 0 and at most {MAX_SECONDS:g} seconds, not {s:g}")
    return s


def duration_option(ctx, param, value):
    """click callback: every window length goes through duration()."""
    return None if value is None else duration(value)


class Watch:
    """The target pids during a window: which exited (or were recycled), and when."""

    def __init__(self, pids: list[int]):
        self.pids = list(pids)
        self.ids = start_times(self.pids)
        self.exited: dict[int, float] = {p: 0.0 for p in self.pids if p not in self.ids}

    def poll(self, elapsed: float) -> None:
        for p in self.pids:
            if p not in self.exited and not alive(p, self.ids[p]):
                self.exited[p] = round(elapsed, 2)

    @property
    def all_gone(self) -> bool:
        return len(self.exited) == len(self.pids)

    def wait(self, seconds: float, tick=None) -> float:
        """Sleep through the window, polling; stops early once every pid is gone. Returns its length."""
        t0 = time.monotonic()
        while (left := seconds - (time.monotonic() - t0)) > 0 and not self.all_gone:
            time.sleep(min(0.25, left))
            elapsed = min(time.monotonic() - t0, seconds)
            self.poll(elapsed)
            if tick:
                tick(elapsed)
        return time.monotonic() - t0

    def gone_error(self, seconds: float) -> "TargetGone":
        return gone_error(self.pids, self.exited, seconds)


class TargetGone(ProxytuneError):
    """Every target exited in the window: nothing to diagnose, and nothing broken (the watcher records
    such a window as the proxy absent, not as a failed look)."""


def gone_error(pids: list[int], exited: dict, seconds: float) -> TargetGone:
    """One line for a window whose every target exited before it closed."""
    last = max(exited.values(), default=0.0)
    return TargetGone(f"the target (pid {', '.join(map(str, pids))}) exited {last:g} s into the {seconds:g} s "
                          "window: nothing left to diagnose", "start the window while the process runs")

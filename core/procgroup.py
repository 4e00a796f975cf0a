"""Tracers we start (bpftrace, perf) run in their own process groups and are
always reaped: stopped with SIGINT so they print what they gathered, killed
if they do not stop, and killed on any exception (Ctrl-C included).

A Children set also owns the run's private temp dir (rundir.RunDir): the
tracers run with it as their working directory and write their files (the
bpftrace program, perf.data) there, and it is removed once they are reaped.
They get SIGKILL if we die (PR_SET_PDEATHSIG), so a SIGKILLed doctor leaves
no system-wide perf running."""

import ctypes
import os
import signal
import subprocess
import time

from . import rundir

PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl      # looked up here: the child only calls it
except (OSError, AttributeError):
    _prctl = None


def die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGKILL it when the thread that started it dies."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


class Children(rundir.InRunDir):
    """A set of background tracer processes; leaving the `with` block reaps them all
    and removes their temp dir (`dir`)."""

    def __init__(self, kind: str = "probe"):
        super().__init__(kind)
        self.procs: list[subprocess.Popen] = []

    def close(self) -> None:
        for p in self.procs:
            kill(p)

    def start(self, argv: list[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.dir,
                             start_new_session=True, preexec_fn=die_with_parent, **kw)
        self.procs.append(p)
        return p


def stop(p: subprocess.Popen, grace: float = 10.0, nudge: tuple[int, float] | None = None) -> tuple[str, str]:
    """SIGINT (bpftrace prints its maps, perf writes its file), wait, then collect output; SIGKILL
    after `grace`. nudge=(signal, every_s) repeats a signal until then: bpftrace 0.17 can lose a
    SIGINT that arrives just after it attached, and it resets SIGINT to the default while it prints
    its maps (so a second SIGINT would kill it mid-print), so its nudge is SIGTERM."""
    deadline = time.monotonic() + grace
    sig = signal.SIGINT
    while True:
        _signal_group(p, sig)
        left = deadline - time.monotonic()
        try:
            return p.communicate(timeout=max(0.0, min(left, nudge[1]) if nudge else left))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                kill(p)
                return p.communicate()
            sig = nudge[0]


def end(p: subprocess.Popen, grace: float = 10.0, nudge: tuple[int, float] = (signal.SIGTERM, 1.0)) -> None:
    """As stop(), for a process whose pipes other threads read (its output is theirs, nothing is
    collected here): SIGINT, nudge until it exits, SIGKILL after `grace`."""
    deadline, sig = time.monotonic() + grace, signal.SIGINT
    while p.poll() is None:
        _signal_group(p, sig)
        try:
            p.wait(timeout=max(0.0, min(deadline - time.monotonic(), nudge[1])))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                kill(p)
                return
            sig = nudge[0]


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass


def kill(p: subprocess.Popen) -> None:
    _signal_group(p, signal.SIGKILL)
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass

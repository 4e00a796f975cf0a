"""Tracers we start (bpftrace, perf) run in their own process groups and are
always reaped: stopped with SIGINT so they print what they gathered, killed
if they do not stop, and killed on any exception (Ctrl-C included)."""

import os
import signal
import subprocess
import threading


class Children:
    """A set of background tracer processes; leaving the `with` block reaps them all."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self._old = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():   # handlers can only be set there
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._old[sig] = signal.signal(sig, _interrupt)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            kill(p)
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        return False

    def start(self, argv: list[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, **kw)
        self.procs.append(p)
        return p


def stop(p: subprocess.Popen, grace: float = 10.0) -> tuple[str, str]:
    """SIGINT (bpftrace prints its maps, perf writes its file), wait, then collect output."""
    _signal_group(p, signal.SIGINT)
    try:
        return p.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        kill(p)
        return p.communicate()


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


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")

"""The one way to say whether a mechanism is there: Capability(ok, why).

Internal APIs return a Capability (never a bare (bool, str), a "why not"
string or None, or a dict); result JSON keeps its {"available": ..., "reason":
...} shape through to_result(). Checks that several packages need (perf's
counters and tracepoints) are made here, once.
"""

import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Capability:
    ok: bool
    why: str            # what is there, or why it is not, in one line

    def to_result(self, **extra) -> dict:
        """The result-JSON form: {"available": ok, "reason": why, ...extra}."""
        return {"available": self.ok, "reason": self.why, **extra}


def yes(why: str) -> Capability:
    return Capability(True, why)


def no(why: str) -> Capability:
    return Capability(False, why)


def perf_counts(events: str, timeout: float = 20) -> Capability:
    """Whether `perf stat -e EVENTS` counts here (hardware counters are missing in most VMs;
    a tracepoint event needs tracefs and, usually, root)."""
    if not shutil.which("perf"):
        return no("perf is not installed (Debian: linux-perf)")
    try:
        p = subprocess.run(["perf", "stat", "-x,", "-e", events, "true"], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return no(f"perf stat -e {events} timed out")
    if p.returncode != 0 or "<not supported>" in p.stderr or "<not counted>" in p.stderr:
        return no(f"perf cannot count {events} here: {' '.join(p.stderr.split())[-120:] or 'not supported'}")
    return yes(f"perf counts {events}")

"""What a proxy spends per request during a measured phase: system calls
(perf stat on the raw_syscalls:sys_enter tracepoint, every thread of the
proxy's processes; no hardware counters needed) and bytes it sent to the
storage layer (/proc/PID/io write_bytes: page-cache writeback and direct
I/O charged to the process). Either is reported unavailable, never guessed,
when the kernel does not give it."""

import re
import shutil
import signal
import subprocess

from proxytune.core import procfs


def write_bytes(pids: list[int]) -> int | None:
    """Summed over pids; None when the kernel gives it for none of them."""
    counts = [n for n in map(procfs.write_bytes, pids) if n is not None]
    return sum(counts) if counts else None


class Cost:
    """with Cost(pid) as c: ...  then c.result(requests) -> syscalls and device writes per request."""

    def __init__(self, pid: int):
        self.pids = procfs.descendants(pid)
        self.perf: subprocess.Popen | None = None
        self.syscalls: int | None = None
        self.why = None

    def __enter__(self):
        self.w0 = write_bytes(self.pids)
        if not shutil.which("perf"):
            self.why = "perf is not installed"
        else:
            self.perf = subprocess.Popen(["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter",
                                          "-p", ",".join(map(str, self.pids))],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc):
        self.w1 = write_bytes(self.pids)
        if self.perf:
            self.perf.send_signal(signal.SIGINT)
            try:
                _, err = self.perf.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                self.perf.kill()
                _, err = self.perf.communicate()
            m = re.search(r"^(\d+),[^,]*,raw_syscalls:sys_enter", err, re.M)
            self.syscalls = int(m.group(1)) if m else None
            self.why = None if m else f"perf stat counted nothing: {err.strip()[-160:]}"
        return False

    def result(self, requests: int) -> dict:
        writes = self.w1 - self.w0 if self.w0 is not None and self.w1 is not None else None
        return {"pids": self.pids, "requests": requests, "syscalls": self.syscalls,
                "syscalls_per_request": round(self.syscalls / requests, 1) if self.syscalls and requests else None,
                "syscalls_unavailable": self.why,
                "device_write_mb": round(writes / 1048576, 1) if writes is not None else None,
                "device_write_kb_per_request": round(writes / 1024 / requests, 2) if writes is not None and requests
                else None}

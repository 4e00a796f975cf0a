"""What each BPF program of a running tracer costs, from the kernel's own
counters: with sysctl kernel.bpf_stats_enabled = 1 the kernel times every
run of every program (kernel/bpf/syscall.c, bpf_prog_run's stats:
run_time_ns and run_cnt, shown in /proc/PID/fdinfo of a program's fd).
bpftrace attaches each tracepoint through a perf event fd that carries one
program; BPF_TASK_FD_QUERY (the bpf syscall, as `bpftool perf` uses it)
names the tracepoint and the program id behind such an fd.

The counters are off by default because they cost two clock reads per run:
turn them on only for a window that measures nothing else, and restore the
previous value on every way out."""

import contextlib
import ctypes
import os
import platform
import time
from pathlib import Path

from proxytune.core.capability import no

SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}      # __NR_bpf (arch/*/include/uapi syscall tables)
BPF_TASK_FD_QUERY = 20                              # enum bpf_cmd, include/uapi/linux/bpf.h
FD_TYPES = {0: "raw_tracepoint", 1: "tracepoint", 2: "kprobe", 3: "kretprobe", 4: "uprobe", 5: "uretprobe"}


@contextlib.contextmanager
def enabled():
    """kernel.bpf_stats_enabled = 1 for the body; yields None when on, else why not (the value
    it had is written back in finally, whatever happens in between)."""
    try:
        before = SYSCTL.read_text().strip()
    except OSError as e:
        yield f"{SYSCTL} is not readable ({e.strerror})"
        return
    try:
        SYSCTL.write_text("1\n")
    except OSError as e:
        yield f"cannot set kernel.bpf_stats_enabled ({e.strerror})"
        return
    try:
        yield None
    finally:
        SYSCTL.write_text(before + "\n")


def _fdinfo(pid: int, fd: str) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines()
    except OSError:
        return {}
    return dict(l.split(":", 1) for l in lines if ":" in l)


class _TaskFdQuery(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint32), ("fd", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("buf_len", ctypes.c_uint32), ("buf", ctypes.c_uint64), ("prog_id", ctypes.c_uint32),
                ("fd_type", ctypes.c_uint32), ("probe_offset", ctypes.c_uint64), ("probe_addr", ctypes.c_uint64)]


def _attach_point(pid: int, fd: int) -> tuple[int, str] | None:
    """(program id, "tracepoint NAME") of a perf event fd of pid that carries a BPF program."""
    nr = BPF_SYSCALL.get(platform.machine())
    if nr is None:
        return None
    buf = ctypes.create_string_buffer(256)
    q = _TaskFdQuery(pid=pid, fd=fd, buf_len=len(buf), buf=ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(nr, BPF_TASK_FD_QUERY, ctypes.byref(q), ctypes.sizeof(q)) != 0:
        return None                         # a perf event without a program (bpftrace's output buffers)
    return q.prog_id, f"{FD_TYPES.get(q.fd_type, 'probe')} {buf.value.decode(errors='replace')}"


def programs(pid: int) -> list[dict]:
    """Every BPF program pid holds: id, what it is attached to, run_cnt and run_time_ns so far."""
    progs, names = {}, {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    for fd in fds:
        try:
            kind = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if kind == "anon_inode:bpf-prog":
            info = _fdinfo(pid, fd)
            if "prog_id" in info:
                progs[int(info["prog_id"])] = {"run_cnt": int(info.get("run_cnt", 0)),
                                               "run_time_ns": int(info.get("run_time_ns", 0))}
        elif kind == "anon_inode:[perf_event]":
            found = _attach_point(pid, int(fd))
            if found:
                names[found[0]] = found[1]
    return [{"id": i, "attached": names.get(i, "?"), **c} for i, c in sorted(progs.items())]


def wait_attached(pid: int, count: int, timeout: float = 30.0) -> list[dict]:
    """Until pid holds `count` programs attached to a probe. bpftrace 0.17 prints attached_probes
    before it attaches them: a reading taken then would miss the programs still being attached."""
    deadline = time.monotonic() + timeout
    progs = programs(pid)
    while sum(p["attached"] != "?" for p in progs) < count and time.monotonic() < deadline:
        time.sleep(0.05)
        progs = programs(pid)
    return progs


def rates(first: list[dict], last: list[dict], seconds: float) -> list[dict]:
    """Per program between two readings: runs per second, ns per run and ns per second of CPU,
    most expensive in total first."""
    before = {p["id"]: p for p in first}
    out = []
    for p in last:
        b = before.get(p["id"], {"run_cnt": 0, "run_time_ns": 0})
        runs, ns = p["run_cnt"] - b["run_cnt"], p["run_time_ns"] - b["run_time_ns"]
        out.append({"attached": p["attached"], "runs_per_s": runs / seconds if seconds > 0 else None,
                    "ns_per_run": ns / runs if runs else None,
                    "cpu_ns_per_s": ns / seconds if seconds > 0 else None, "runs": runs})
    return sorted(out, key=lambda r: -(r["cpu_ns_per_s"] or 0))


def unavailable(why: str) -> dict:
    return no(why).to_result()

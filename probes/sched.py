"""What the scheduler says about the proxy's threads over the doctor's
window, for free: /proc/PID/task/TID/schedstat holds three counters per
thread (written by proc_pid_schedstat, fs/proc/base.c): the nanoseconds it ran
(se.sum_exec_runtime), the nanoseconds it waited on a run queue while
runnable (sched_info.run_delay) and the number of time slices it got
(sched_info.pcount). Reading them costs no tracepoint; run_delay needs
schedstats accounting, which the kernel keeps for sched_info whenever
CONFIG_SCHED_INFO is set (Debian's kernels set it).

A thread seen only at the end started in the window (its counters start at
0); one seen only at the start ended in it (what it did after the last
read is lost: said in the evidence).
"""

import os

from proxytune.core.numbers import uint


def _read(pid: int, tid: str) -> list[int] | None:
    try:
        with open(f"/proc/{int(pid)}/task/{tid}/schedstat", encoding="ascii") as f:
            fields = f.read().split()
    except (OSError, ValueError):
        return None
    nums = [uint(x) for x in fields[:3]]
    return nums if len(nums) == 3 and all(n is not None for n in nums) else None


def _comm(pid: int, tid: str) -> str:
    try:
        with open(f"/proc/{int(pid)}/task/{tid}/comm", encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return "?"


def snapshot(pids: list[int]) -> dict:
    """{pid: {tid: [run_ns, run_delay_ns, slices, comm]}} of every thread of pids now."""
    out: dict = {}
    for pid in dict.fromkeys(pids):
        try:
            tids = os.listdir(f"/proc/{int(pid)}/task")
        except OSError:
            continue
        rows = {}
        for tid in tids:
            got = _read(pid, tid)
            if got is not None:
                rows[tid] = got + [_comm(pid, tid)]
        out[str(pid)] = rows
    return out


def delta(before: dict, after: dict, window_s: float) -> dict:
    """Per process and per thread name: CPU run time, run-queue wait and slices gained in the window;
    the busiest thread's share of a CPU (an event loop is one thread: near 1.0 it cannot go faster)."""
    procs, busiest = {}, None
    ended = 0
    for pid, threads in after.items():
        base = before.get(pid, {})
        run = wait = slices = 0
        for tid, (r, d, s, comm) in threads.items():
            r0, d0, s0 = (base.get(tid) or [0, 0, 0])[:3]
            dr, dd, ds = max(0, r - r0), max(0, d - d0), max(0, s - s0)
            run, wait, slices = run + dr, wait + dd, slices + ds
            share = dr / 1e9 / window_s if window_s > 0 else 0.0
            if busiest is None or share > busiest["cpu_share"]:
                busiest = {"pid": int(pid), "tid": int(tid), "comm": comm, "cpu_share": round(share, 4),
                           "run_delay_share": round(dd / 1e9 / window_s, 4) if window_s > 0 else 0.0,
                           "slices": ds}
        ended += sum(1 for tid in base if tid not in threads)
        procs[pid] = {"run_ns": run, "run_delay_ns": wait, "slices": slices, "threads": len(threads)}
    total = {k: sum(p[k] for p in procs.values()) for k in ("run_ns", "run_delay_ns", "slices")}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"available": bool(after), "window_s": window_s, "procs": procs, **total, "cpus": cores,
            "cpu_share_of_host": round(total["run_ns"] / 1e9 / window_s / cores, 4) if window_s > 0 else 0.0,
            "busiest_thread": busiest, "threads_ended_in_window": ended,
            "source": "/proc/PID/task/TID/schedstat: run time, run-queue wait (run_delay), time slices"}

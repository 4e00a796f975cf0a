"""What /proc says about the target processes: CPU time, fd use and limits."""

from proxytune.core.errors import ProxytuneError
import os
import time

from proxytune.core.procfs import (CLK_TCK, all_pids, alive, comm_of, cpu_seconds, fd_count, nofile_limits, pids_of,
                                   read_stat, thread_ids)

from . import target


def resolve(pid: int | None, comm: str | None) -> list[int]:
    """The target pids: one --pid, or every process whose comm is NAME (nginx master + workers).
    Zombies, kernel threads and exiting processes are refused (--pid) or left out (--comm)."""
    if pid is not None:
        target.check(pid)
        return [pid] + workers_of(pid)
    if comm:
        found = pids_of(comm)
        pids = target.watchable(found)
        if found and not pids:
            raise ProxytuneError(f"no process named {comm!r} can be watched: {target.why_not(found[0])}")
        if not pids:
            raise ProxytuneError(f"no running process named {comm!r}", "names are the 15-char comm, see: ps -e -o comm")
        return pids
    raise ProxytuneError("say which process: --pid PID or --comm NAME")


def workers_of(pid: int) -> list[int]:
    """Live children with the parent's name: nginx's workers under its master, squid's kids."""
    name, kids = comm_of(pid), []
    for p in all_pids():
        st = read_stat(p)
        if st is not None and st.ppid == pid and comm_of(st.pid) == name:
            kids.append(st.pid)
    return sorted(target.watchable(kids))


def snapshot(pids: list[int], ids: dict[int, int] | None = None) -> dict[int, dict]:
    """/proc figures per pid; with `ids` (pid -> start time) only the pids still the same process."""
    out = {}
    for pid in pids:
        if ids is not None and not alive(pid, ids.get(pid, -1)):
            continue
        lim = nofile_limits(pid)
        out[pid] = {"comm": comm_of(pid), "cpu_s": cpu_seconds(pid), "fds_open": fd_count(pid),
                    "nofile_soft": lim[0] if lim else None, "nofile_hard": lim[1] if lim else None}
    return out


BUSIEST_KEPT = 5


def thread_times(pids: list[int]) -> tuple[float, dict[int, tuple[int, str, float]]]:
    """(when, on the monotonic clock; tid -> (pid, thread name, utime + stime in seconds)) of every thread of the
    pids, from /proc/PID/task/TID/stat: the thread's own CPU (the process's line sums them all)."""
    at, out = time.monotonic(), {}
    for pid in dict.fromkeys(pids):
        for tid in thread_ids(pid):
            try:
                with open(f"/proc/{int(pid)}/task/{int(tid)}/stat", encoding="ascii", errors="replace") as fh:
                    text = fh.read()
            except OSError:
                continue
            head, _, rest = text.rpartition(")")
            f = rest.split()
            if len(f) >= 13 and f[11].isdigit() and f[12].isdigit():
                out[tid] = (pid, head.partition("(")[2], (int(f[11]) + int(f[12])) / CLK_TCK)
    return at, out


def cpus_allowed(pid: int) -> int | None:
    try:
        return len(os.sched_getaffinity(int(pid)))
    except (OSError, ValueError):
        return None


def busiest_threads(start: tuple[float, dict], end: tuple[float, dict], pid: int) -> dict:
    """Per-thread CPU between two thread_times() reads, in cores, busiest first: an event loop's thread near a
    full core is what its requests wait on (findings.cpu_waited_on)."""
    (t0, before), (t1, after) = start, end
    window = t1 - t0
    if window <= 0 or not after:
        return {"available": False, "reason": "no thread of the target was read"}
    rows = [{"pid": p, "tid": tid, "comm": comm, "cores": round((cpu - before[tid][2]) / window, 3)}
            for tid, (p, comm, cpu) in after.items() if tid in before]
    rows.sort(key=lambda r: -r["cores"])
    return {"available": True, "threads": len(rows), "cpus_allowed": cpus_allowed(pid),
            "busiest": rows[:BUSIEST_KEPT], "tick_s": round(1 / CLK_TCK, 3),
            "source": "/proc/PID/task/TID/stat utime + stime, window start to end"}

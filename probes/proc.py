"""What /proc says about the target processes: CPU time, fd use and limits."""

import os
import sys
import time

from proxytune.core import proxytree
from proxytune.core.numbers import is_uint
from proxytune.core.errors import ProxytuneError, one_line
from proxytune.core.procfs import (CLK_TCK, all_pids, alive, comm_of, cpu_seconds, fd_count, nofile_limits, pids_of,
                                   read_stat, thread_ids)

from proxytune import proxies

from . import target


def resolve(pid: int | None, comm: str | None) -> list[int]:
    """The target pids: one --pid (the operator's choice), or the processes named NAME that belong to
    a proxy's service (core.proxytree: nginx's master and workers, never a user's namesake).
    Zombies, kernel threads and exiting processes are refused (--pid) or left out (--comm)."""
    if pid is not None:
        target.check(pid)
        return [pid] + workers_of(pid)
    if comm:
        found = pids_of(comm)
        if found and not target.watchable(found):
            raise ProxytuneError(f"no process named {comm!r} can be watched: {target.why_not(found[0])}")
        if not found:
            raise ProxytuneError(f"no running process named {comm!r}", "names are the 15-char comm, see: ps -e -o comm")
        return _of_a_service(comm)
    raise ProxytuneError("say which process: --pid PID or --comm NAME")


def _of_a_service(comm: str) -> list[int]:
    """The watchable processes named `comm` in a proxy's service; the trees left out said on stderr."""
    procs, units = proxytree.Processes(), proxytree.Units()
    pids, notes = [], []
    for ident in proxies.identities_for(comm):
        choice = proxytree.find(ident, procs, units)
        pids += proxytree.named(choice, comm, procs)
        notes += [choice.note()] if choice.note() else []
    pids = target.watchable(sorted(set(pids)))
    if not pids:
        raise ProxytuneError(one_line(f"no process named {comm!r} belongs to a proxy's service" +
                                      (f": {'; '.join(notes)}" if notes else "")),
                             "a user's program of that name is not watched by name; --pid PID watches one anyway")
    for n in notes if sys.stderr is not None else ():       # (print to a closed stderr would go to stdout)
        print(one_line(f"proxytune: note: {n}"), file=sys.stderr)
    return pids


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
            if len(f) >= 13 and is_uint(f[11]) and is_uint(f[12]):
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

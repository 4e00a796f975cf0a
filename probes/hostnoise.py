"""What on a shared host disturbs a CPU-cost measurement, and the shields
`probe overhead` uses: a higher priority for the whole experiment, and
spotting other users' tracers, whose tracepoints slow every task (ours in
the runs meant to have nothing attached included), and pinning the proxy
apart from its load so every run places the work the same way."""

import contextlib
import os

from proxytune.core import procfs

NICE = -10            # the experiment's priority: other work on a shared host gets less of its CPUs
PERF_TRACING = ("trace", "record", "stat", "top")      # perf subcommands that attach events (not bench, script)


def _is_tracer(st: procfs.ProcStat) -> bool:
    if st.comm == "bpftrace":
        return True
    argv = procfs.argv_of(st.pid) if st.comm == "perf" else None
    return bool(argv) and len(argv) > 1 and argv[1] in PERF_TRACING


def foreign_tracers() -> list[int]:
    """bpftrace and tracing perf processes this measurement did not start: another user's tracer
    enables tracepoints for every task, ours included, and would make an "off" run an "on" run."""
    me = os.getpid()
    return [p for p in procfs.all_pids() if (st := procfs.read_stat(p)) and st.ppid != me and _is_tracer(st)]


@contextlib.contextmanager
def priority(nice: int):
    """Run the experiment (nginx, wrk and the tracers all inherit it from this thread) at `nice`,
    so that other work on the host disturbs it less; restored on the way out. Yields the nice value
    in effect (unchanged where the host does not allow raising priority)."""
    old = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        pass
    try:
        yield os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, old)
        except OSError:
            pass


@contextlib.contextmanager
def pinned(pids: list[int]):
    """The watched proxy's threads on the last CPU this process may use, and this thread (so
    wrk, the tracers and the threads started from here) on the others: otherwise the scheduler
    moves nginx next to wrk in one run and apart in the next, and its CPU per request with it.
    Yields {"proxy": [cpu], "load": [cpus]}, or None with fewer than 2 CPUs; this thread's
    affinity is restored on the way out."""
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        yield None
        return
    cpus = sorted(mine)
    layout = {"proxy": cpus[-1:], "load": cpus[:-1]}
    try:
        for tid in (t for p in pids for t in procfs.thread_ids(p)):
            with contextlib.suppress(OSError):      # a thread that just exited
                os.sched_setaffinity(tid, layout["proxy"])
        os.sched_setaffinity(0, layout["load"])
        yield layout
    finally:
        os.sched_setaffinity(0, mine)

"""What on a shared host disturbs a CPU-cost measurement, and the shields
`probe overhead` uses: a higher priority for the whole experiment, and
spotting other users' tracers, whose tracepoints slow every task (ours in
the runs meant to have nothing attached included).

Pinning nginx to a CPU of its own was tried and made it worse: alone on
its CPU nginx wakes per request, and A/A pairs spread -24..+88 % against
-12..+6 % unpinned (docs/results/doctor-overhead-aa-pinned.json)."""

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

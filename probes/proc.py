"""What /proc says about the target processes: CPU time, fd use and limits."""

from proxytune.core.errors import ProxytuneError
from proxytune.core.procfs import all_pids, alive, comm_of, cpu_seconds, fd_count, nofile_limits, pids_of, read_stat

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

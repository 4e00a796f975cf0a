"""What /proc says about the target processes: CPU time, fd use and limits."""

import os
from pathlib import Path

from proxytune.tune.observe import proc_limits
from proxytune.tune.procs import fd_count, pids_of
from proxytune.tune.errors import ProxytuneError

from . import target

CLK_TCK = os.sysconf("SC_CLK_TCK")


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
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = target.read_stat(int(entry.name))
            if st is not None and st.ppid == pid and comm_of(st.pid) == name:
                kids.append(st.pid)
    return sorted(target.watchable(kids))


def comm_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def exe_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of every thread of pid, in seconds."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(f[11]) + int(f[12])) / CLK_TCK


def snapshot(pids: list[int], ids: dict[int, int] | None = None) -> dict[int, dict]:
    """/proc figures per pid; with `ids` (pid -> start time) only the pids still the same process."""
    out = {}
    for pid in pids:
        if ids is not None and not target.alive(pid, ids.get(pid, -1)):
            continue
        lim = proc_limits(pid)
        out[pid] = {"comm": comm_of(pid), "cpu_s": cpu_seconds(pid), "fds_open": fd_count(pid),
                    "nofile_soft": lim[0] if lim else None, "nofile_hard": lim[1] if lim else None}
    return out

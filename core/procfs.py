"""The /proc readers every package uses, once.

A process is its pid plus its start time (field 22 of /proc/PID/stat, clock
ticks after boot): a pid alone may be recycled. Every reader returns None
(or an empty list) for a process that is gone or not ours to read, never
raises for it: processes exit between any two reads.
"""

import os
import re
import resource
from dataclasses import dataclass
from pathlib import Path

from .numbers import is_uint

CLK_TCK = os.sysconf("SC_CLK_TCK")
CAP_SYS_RESOURCE = 24
RLIMITS = {
    "nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC,
    "memlock": resource.RLIMIT_MEMLOCK, "core": resource.RLIMIT_CORE,
}
GONE = ("Z", "X", "x")          # zombie or dead: no process left to act on


@dataclass(frozen=True)
class ProcStat:
    pid: int
    comm: str
    state: str
    ppid: int
    flags: int
    start: int              # clock ticks after boot
    cpu_ticks: int          # utime + stime of every thread

    @property
    def gone(self) -> bool:
        return self.state in GONE


def read_stat(pid: int) -> ProcStat | None:
    """/proc/PID/stat parsed past the comm (which may hold spaces and parentheses); None when gone."""
    try:
        text = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError, TypeError):
        return None
    head, _, rest = text.rpartition(")")
    f = rest.split()
    if len(f) < 20:
        return None
    return ProcStat(int(pid), head.partition("(")[2], f[0], int(f[1]), int(f[6]), int(f[19]),
                    int(f[11]) + int(f[12]))


def all_pids() -> list[int]:
    return sorted(int(e.name) for e in Path("/proc").iterdir() if is_uint(e.name))


def identity(pid: int) -> dict | None:
    """A live process as {pid, start, comm}, the form journals and locks record."""
    st = read_stat(pid)
    if st is None or st.gone:
        return None
    return {"pid": st.pid, "start": st.start, "comm": st.comm}


def same_process(recorded: dict) -> bool:
    """True when the process recorded earlier (pid, start, comm) is still running."""
    now = identity(recorded.get("pid", -1))
    return now is not None and now["start"] == recorded.get("start") and now["comm"] == recorded.get("comm")


def alive(pid: int, start: int) -> bool:
    """Still the process seen before: same pid, same start time, not a zombie."""
    st = read_stat(pid)
    return st is not None and st.start == start and not st.gone


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().removesuffix("\n")
    except OSError:
        return None


def comm_of(pid: int) -> str:
    """The process name ("?" when gone)."""
    name = _comm(pid)
    return "?" if name is None else name


def pids_of(comm: str) -> list[int]:
    """Pids whose /proc/PID/comm is `comm` (truncated to 15 chars, as the kernel does)."""
    want = comm[:15]
    return [pid for pid in all_pids() if _comm(pid) == want]


def exe_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def argv_of(pid: int) -> list[str] | None:
    """The command line, one string per argument."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def nofile_limits(pid: int) -> tuple[int | str, int | str] | None:
    """(soft, hard) open-file limits of a running process; "unlimited" as such."""
    try:
        text = Path(f"/proc/{pid}/limits").read_text()
    except OSError:
        return None
    m = re.search(r"^Max open files\s+([0-9]+|unlimited)\s+([0-9]+|unlimited)", text, re.M)
    conv = lambda v: v if v == "unlimited" else int(v)
    return (conv(m.group(1)), conv(m.group(2))) if m else None


def _number(pid: int, name: str, pattern: str) -> int | None:
    """The first group of `pattern` in /proc/PID/NAME as an int; None when gone or absent."""
    try:
        m = re.search(pattern, Path(f"/proc/{pid}/{name}").read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def uid_of(pid: int) -> int | None:
    """The real uid the process runs as (/proc/PID/status Uid:)."""
    return _number(pid, "status", r"^Uid:\s+(\d+)")


def uids_of(pid: int, which: str = "Uid") -> tuple[int, ...] | None:
    """(real, effective, saved, filesystem) uids (or, which="Gid", gids) of the process
    (/proc/PID/status); None when gone."""
    try:
        text = Path(f"/proc/{int(pid)}/status").read_text()
    except (OSError, ValueError):
        return None
    m = re.search(rf"^{which}:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", text, re.M)
    return tuple(int(x) for x in m.groups()) if m else None


LIMIT_ROWS = {"nofile": "Max open files", "nproc": "Max processes", "memlock": "Max locked memory",
              "core": "Max core file size"}


def limits_of(pid: int, name: str) -> tuple[int, int] | None:
    """(soft, hard) of one of RLIMITS from /proc/PID/limits (unlimited: RLIM_INFINITY), as prlimit(2)
    gives them; readable for any process, where prlimit needs the same uid or CAP_SYS_RESOURCE."""
    try:
        text = Path(f"/proc/{int(pid)}/limits").read_text()
    except (OSError, ValueError):
        return None
    m = re.search(rf"^{LIMIT_ROWS[name]}\s+([0-9]+|unlimited)\s+([0-9]+|unlimited)", text, re.M)
    conv = lambda v: resource.RLIM_INFINITY if v == "unlimited" else int(v)
    return (conv(m.group(1)), conv(m.group(2))) if m else None


def cgroups_of(pid: int) -> list[tuple[str, str]]:
    """(controllers, path) of each hierarchy the process is in (/proc/PID/cgroup): ("", path) is the
    unified (v2) one, ("name=systemd", path) systemd's legacy one; empty when gone."""
    try:
        text = Path(f"/proc/{int(pid)}/cgroup").read_text()
    except (OSError, ValueError):
        return []
    return [(parts[1], parts[2]) for line in text.splitlines() if len(parts := line.split(":", 2)) == 3]


def write_bytes(pid: int) -> int | None:
    """Bytes the process caused to be sent to storage (/proc/PID/io write_bytes; needs task I/O accounting)."""
    return _number(pid, "io", r"^write_bytes:\s*(\d+)")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of every thread of pid, in seconds."""
    st = read_stat(pid)
    return None if st is None else st.cpu_ticks / CLK_TCK


def _threads(pid: int) -> list[Path]:
    try:
        return list(Path(f"/proc/{int(pid)}/task").iterdir())
    except (OSError, ValueError, TypeError):
        return []


def thread_ids(pid: int) -> list[int]:
    """The tids of pid's threads (empty when it is gone)."""
    return [int(t.name) for t in _threads(pid) if is_uint(t.name)]


def run_seconds(pid: int) -> float | None:
    """CPU time of every thread of pid from the scheduler's nanosecond run time
    (/proc/PID/task/TID/schedstat); cpu_seconds' 10 ms ticks where schedstat is missing."""
    try:
        return sum(int((t / "schedstat").read_text().split()[0]) for t in _threads(pid)) / 1e9 or cpu_seconds(pid)
    except (OSError, ValueError, IndexError):
        return cpu_seconds(pid)


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of pid (0 when gone)."""
    n = 0
    for t in _threads(pid):
        try:
            text = (t / "status").read_text()
        except OSError:
            continue
        n += sum(int(v) for v in re.findall(r"^(?:non)?voluntary_ctxt_switches:\s*(\d+)", text, re.M))
    return n


def descendants(pid: int) -> list[int]:
    """pid and every process below it (nginx workers, varnishd's cache child, squid's kids). Read from
    each thread's /proc/PID/task/TID/children (Linux 3.5, CONFIG_PROC_CHILDREN), a few files for a
    proxy's tree, where a scan reads the stat of every process on the host (the watcher asks every
    window); the scan where the kernel has no such file."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        kids = _children(p)
        if kids is None:
            return _descendants_by_scan(pid)
        todo += [k for k in kids if k not in out and k not in todo]
    return sorted(out)


def _children(pid: int) -> list[int] | None:
    """The children of every thread of pid; [] when it is gone, None when the kernel lacks the file."""
    try:
        tids = os.listdir(f"/proc/{int(pid)}/task")
    except OSError:
        return []
    kids = []
    for tid in tids:
        try:
            with open(f"/proc/{int(pid)}/task/{tid}/children", encoding="ascii") as fh:
                kids += [int(k) for k in fh.read().split() if is_uint(k)]
        except FileNotFoundError:
            if os.path.isdir(f"/proc/{int(pid)}/task/{tid}"):
                return None                     # the thread is there, its children file is not
        except OSError:
            continue
    return kids


def _descendants_by_scan(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in all_pids():
        if (st := read_stat(p)) is not None:
            children.setdefault(st.ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return sorted(out)


def started_at(pid: int) -> float | None:
    """When pid started, in seconds since the epoch (boot time + its start tick)."""
    st = read_stat(pid)
    try:
        boot = int(re.search(r"^btime (\d+)", Path("/proc/stat").read_text(), re.M).group(1))
    except (OSError, AttributeError):
        return None
    return None if st is None else boot + st.start / CLK_TCK


def has_capability(bit: int) -> bool:
    """Effective capability check from /proc/self/status (CAP_SYS_RESOURCE is 24)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False

"""Finding proxy processes and reading what /proc says about them."""

import os
from pathlib import Path

import resource

RLIMITS = {
    "nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC,
    "memlock": resource.RLIMIT_MEMLOCK, "core": resource.RLIMIT_CORE,
}
KNOWN_PROXIES = ("squid", "nginx", "haproxy", "varnishd", "traffic_server")


def pids_of(comm: str) -> list[int]:
    """Pids whose /proc/PID/comm is `comm` (truncated to 15 chars, as the kernel does)."""
    want = comm[:15]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() == want:
                found.append(int(entry.name))
        except OSError:
            continue
    return sorted(found)


def fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def has_capability(bit: int) -> bool:
    """Effective capability check from /proc/self/status (CAP_SYS_RESOURCE is 24)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


CAP_SYS_RESOURCE = 24


def identity(pid: int) -> dict | None:
    """A process as {pid, start, comm}: the pid alone may be recycled, the start time
    (clock ticks since boot, /proc/PID/stat field 22) and comm together may not."""
    try:
        raw = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    comm = raw[raw.find("(") + 1:raw.rfind(")")]
    fields = raw[raw.rfind(")") + 2:].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None                       # a zombie has no process left to act on
    return {"pid": int(pid), "start": int(fields[19]), "comm": comm}


def same_process(recorded: dict) -> bool:
    """True when the process recorded earlier (pid, start, comm) is still running."""
    now = identity(recorded.get("pid", -1))
    return now is not None and now["start"] == recorded.get("start") and now["comm"] == recorded.get("comm")

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

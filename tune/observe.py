"""What the running proxy itself shows: its real fd limit and use, its
listen backlogs, and the atime mode of its cache directories.

A profile says what the host should be; this says what the proxy actually
got (a service started before a limit was raised keeps its old limit).
"""

import re
import subprocess

from .backends.mount import atime_mode, mount_of
from proxytune.core.errors import NotApplicable
from proxytune.core.procfs import fd_count, nofile_limits, pids_of
from proxytune.core.numbers import is_uint

FD_USE_WARN = 0.8          # fds open / soft limit above this: fd-exhaustion is near
LOW_NOFILE = 4096          # a busy proxy needs more than Debian's soft default of 1024


def listeners() -> list[dict]:
    """Listening TCP sockets with their owning pids (ss -ltnpH)."""
    try:
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10).stdout
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return []
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) < 5 or not (is_uint(f[1]) and is_uint(f[2])):
            continue        # not a socket row we understand: skip it rather than fail the audit
        pids = [int(p) for p in re.findall(r"pid=([0-9]+)", line)]
        rows.append({"local": f[3], "queued": int(f[1]), "backlog": int(f[2]), "pids": pids})
    return rows


def connections(ports: set[str], pids: list[int]) -> dict | None:
    """Established TCP connections the pids hold, counted by the kernel: `clients` on their listening
    ports, `total` with the ones to origins (some proxies' own gauges lag or read 0 under load)."""
    try:
        out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True,
                             timeout=10).stdout
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    want, n = set(pids), {"clients": 0, "total": 0}
    for line in out.splitlines():
        f = line.split()
        if len(f) < 4 or not want & {int(p) for p in re.findall(r"pid=([0-9]+)", line)}:
            continue
        n["total"] += 1
        n["clients"] += f[2].rsplit(":", 1)[-1] in ports
    return n


def observe(service: str, cache_dirs: list[str], somaxconn: int | None) -> dict:
    """Observations with a status each: ok or warn (warn makes `tune check` exit 1)."""
    pids = pids_of(service)
    procs, sockets, dirs = [], [], []
    for pid in pids:
        lim = nofile_limits(pid)
        fds = fd_count(pid)
        if lim is None:
            continue
        soft = lim[0]
        use = fds / soft if isinstance(soft, int) and fds is not None else 0.0
        status, note = "ok", ""
        if use >= FD_USE_WARN:
            status, note = "warn", f"{fds} of {soft} fds in use: close to fd exhaustion"
        elif isinstance(soft, int) and soft < LOW_NOFILE:
            status, note = "warn", f"soft nofile limit {soft} is low for a busy proxy"
        procs.append({"pid": pid, "nofile_soft": soft, "nofile_hard": lim[1], "fds_open": fds,
                      "status": status, "note": note})
    for sock in listeners():
        if set(sock["pids"]) & set(pids):
            status, note = "ok", ""
            if sock["queued"] >= sock["backlog"] > 0:
                status, note = "warn", "accept queue full right now"
            elif somaxconn and sock["backlog"] >= somaxconn:
                note = f"backlog capped by net.core.somaxconn ({somaxconn})"
            sockets.append({**sock, "status": status, "note": note})
    for d in cache_dirs:
        try:
            mp, opts = mount_of(d)
        except (NotApplicable, OSError):
            dirs.append({"path": d, "status": "warn", "note": "not found"})
            continue
        mode = atime_mode(opts)
        dirs.append({"path": d, "mountpoint": mp, "atime": mode, "options": ",".join(opts),
                     "status": "ok" if mode == "noatime" else "warn",
                     "note": "" if mode == "noatime" else f"{mode}: every cache hit may write atime"})
    return {"service": service, "running": bool(pids), "processes": procs,
            "listeners": sockets, "cache_dirs": dirs}


def warnings(obs: dict) -> int:
    return sum(1 for group in ("processes", "listeners", "cache_dirs")
               for item in obs[group] if item["status"] == "warn")

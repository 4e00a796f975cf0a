"""What the running proxy itself shows: its real fd limit and use, its
listen backlogs, and the atime mode of its cache directories.

A profile says what the host should be; this says what the proxy actually
got (a service started before a limit was raised keeps its old limit).
"""

from .backends.mount import atime_mode, mount_of
from proxytune.core import proxytree
from proxytune.core.errors import NotApplicable
from proxytune import proxies
from proxytune.core import sockets as probe_sockets
from proxytune.core.procfs import fd_count, nofile_limits

FD_USE_WARN = 0.8          # fds open / soft limit above this: fd-exhaustion is near
LOW_NOFILE = 4096          # a busy proxy needs more than Debian's soft default of 1024


def service_pids(service: str, live: bool = True) -> list[int]:
    """The service's own processes (core.proxytree: a user's namesake is not one); none under --root."""
    if not service or not live:
        return []
    procs = proxytree.Processes()
    return proxytree.own(proxytree.find(proxies.identity_for(service), procs), procs)


def observe(service: str, cache_dirs: list[str], somaxconn: int | None, live: bool = True) -> dict:
    """Observations with a status each: ok or warn (warn makes `tune check` exit 1)."""
    pids = service_pids(service, live)
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
    for sock in probe_sockets.listeners(pids):      # by socket inode: no process name is parsed
        if sock["pids"]:
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

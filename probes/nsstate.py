"""Namespace-wide kernel resources a proxy host runs out of: TIME_WAIT
buckets, conntrack entries, TCP memory, orphaned sockets.

They are read in the TARGET's network namespace (a proxy in a container has
its own): files under /proc/PID/net directly, sysctls by a thread that
enters its namespace, since /proc/sys shows the namespace of whoever reads it. tcp_mem
and tcp_max_orphans are global (ipv4_table in net/ipv4/sysctl_net_ipv4.c,
not ipv4_net_table): a child namespace has no such file, so they are read
from the host's /proc/sys and said to be global. So are the `orphan` and
`mem` fields of sockstat (tcp_orphan_count_sum, proto_memory_allocated in
net/ipv4/proc.c); `inuse` and `tw` are the namespace's own.
"""

import os
from pathlib import Path

from proxytune.core import netns
from proxytune.core.numbers import uint

PER_NS = ("net.ipv4.tcp_max_tw_buckets", "net.ipv4.tcp_fin_timeout", "net.netfilter.nf_conntrack_count",
          "net.netfilter.nf_conntrack_max", "net.netfilter.nf_conntrack_buckets",
          "net.core.somaxconn")          # what a listener's backlog is capped at (proxies/haproxy.backlog_maxconn)
GLOBAL = ("net.ipv4.tcp_mem", "net.ipv4.tcp_max_orphans")
CT_STATS = ("drop", "insert_failed", "early_drop")


def _path(name: str) -> str:
    return "/proc/sys/" + name.replace(".", "/")


def _number(text: str):
    """'131072' -> 131072, '1 2 3' -> [1, 2, 3]; None when it is not numbers."""
    try:
        vals = [int(v) for v in text.split()]
    except ValueError:
        return None
    return vals[0] if len(vals) == 1 else (vals or None)


def _per_ns() -> dict:
    """PER_NS as this thread's network namespace has them (a name it lacks is left out)."""
    out = {}
    for name in PER_NS:
        try:
            out[name] = _number(Path(_path(name)).read_text())
        except OSError:
            pass
    return out


def sysctls(pid: int) -> tuple[dict, str | None]:
    """PER_NS read in pid's namespace, GLOBAL from /proc/sys; a name its namespace lacks is left out.
    The second value says why the namespace could not be read at all. A file under /proc/sys/net is
    the namespace of the task that opens it (net/sysctl_net.c: current->nsproxy->net_ns), so another
    namespace's are read by a thread that enters it (core/netns.run_in), not by an nsenter process a
    window (the watcher reads them every window)."""
    out, error = {}, None
    try:
        out = netns.run_in(pid, _per_ns)
    except OSError as e:
        error = f"cannot enter its network namespace: {e.strerror or e}"
    for name in GLOBAL:
        try:
            out[name] = _number(Path(_path(name)).read_text())
        except OSError:
            pass
    return out, error


def port_range(pid: int) -> str | None:
    """pid's net.ipv4.ip_local_port_range ("LOW HIGH"), a per-namespace setting read as sysctls() reads
    them; ours when its namespace cannot be entered (an approximation the connect rules only print)."""
    def read() -> str:
        return " ".join(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    try:
        return netns.run_in(pid, read)
    except OSError:
        pass
    try:
        return read()
    except OSError:
        return None


def sockstat(pid: int) -> dict | None:
    """The TCP line of /proc/PID/net/sockstat: inuse, orphan, tw, alloc, mem (pages)."""
    try:
        lines = Path(f"/proc/{pid}/net/sockstat").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        words = line.split()
        if words[:1] == ["TCP:"]:
            return {k: n for k, v in zip(words[1::2], words[2::2]) if (n := uint(v)) is not None}
    return None


def conntrack_stats(pid: int) -> dict | None:
    """CT_STATS summed over CPUs from /proc/PID/net/stat/nf_conntrack (hex, one row per CPU); None without it."""
    try:
        lines = Path(f"/proc/{pid}/net/stat/nf_conntrack").read_text().splitlines()
    except OSError:
        return None
    if not lines:
        return None
    head = lines[0].split()
    out = dict.fromkeys((k for k in CT_STATS if k in head), 0)
    for row in lines[1:]:
        vals = row.split()
        for k in out:
            i = head.index(k)
            if i < len(vals):
                out[k] += int(vals[i], 16)
    return out


def conntrack(values: dict, error: str | None, before: dict | None, after: dict | None) -> dict:
    """The namespace's conntrack table: entries against the cap and the drops in the window, or why not."""
    count, cap = values.get("net.netfilter.nf_conntrack_count"), values.get("net.netfilter.nf_conntrack_max")
    if not (isinstance(count, int) and isinstance(cap, int)):
        return {"available": False,
                "reason": f"could not read the target's namespace: {error}" if error else
                "nf_conntrack is not loaded (no net.netfilter.nf_conntrack_count in the target's namespace)"}
    return {"available": True, "count": count, "max": cap, "buckets": values.get("net.netfilter.nf_conntrack_buckets"),
            "use": round(count / cap, 4) if cap else None,
            "stats_delta": ({k: after[k] - before.get(k, 0) for k in after} if before is not None and after
                            else None)}


def read(pid: int, ct_before: dict | None) -> dict:
    """Everything above for the evidence; ct_before is conntrack_stats() at the start of the window."""
    values, error = sysctls(pid)
    return {"sysctl": values, "sysctl_error": error, "global": list(GLOBAL) + ["sockstat.orphan", "sockstat.mem"],
            "sockstat": sockstat(pid), "page_size": os.sysconf("SC_PAGE_SIZE"),
            "conntrack": conntrack(values, error, ct_before, conntrack_stats(pid))}

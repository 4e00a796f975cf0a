"""Counters bpftrace cannot see reliably without kprobes: accept-queue and
SYN-queue drops, TIME_WAIT buckets refused, TCP memory pressure and
orphans reset from /proc/net/netstat (TcpExt), sampled before and after
the window. They are per network namespace, not per process."""

from pathlib import Path

WANTED = ("ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPReqQFullDoCookies", "SyncookiesSent",
          "TCPTimeWaitOverflow", "TW", "TCPMemoryPressures", "TCPAbortOnMemory", "TCPRcvQDrop", "RcvPruned")


# From the snmp file next to it: SYN-ACKs (and anything else) the namespace could not route.
SNMP_WANTED = ("OutNoRoutes",)


def _group(path: Path, group: str, wanted: tuple[str, ...]) -> dict[str, int]:
    """One group's counters by name (the file holds a header line and a value line per group)."""
    lines = path.read_text().splitlines()
    out = {}
    for head, vals in zip(lines[::2], lines[1::2]):
        names, values = head.split(), vals.split()
        if names and names[0] == group:
            out.update({n: int(v) for n, v in zip(names[1:], values[1:]) if n in wanted})
    return out


def snapshot(path: str = "/proc/net/netstat") -> dict[str, int]:
    """TcpExt counters by name, with Ip OutNoRoutes from the snmp file beside it when it is there."""
    out = _group(Path(path), "TcpExt:", WANTED)
    try:
        out.update(_group(Path(path).with_name("snmp"), "Ip:", SNMP_WANTED))
    except OSError:
        pass
    return out


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}

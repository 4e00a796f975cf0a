"""Counters bpftrace cannot see reliably without kprobes: accept-queue and
SYN-queue drops from /proc/net/netstat (TcpExt), sampled before and after
the window. They are per network namespace, not per process."""

from pathlib import Path

WANTED = ("ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPReqQFullDoCookies", "SyncookiesSent",
          "TCPTimeWaitOverflow", "TW")


def snapshot(path: str = "/proc/net/netstat") -> dict[str, int]:
    """TcpExt counters by name (the file holds a header line and a value line per group)."""
    lines = Path(path).read_text().splitlines()
    out = {}
    for head, vals in zip(lines[::2], lines[1::2]):
        names, values = head.split(), vals.split()
        if names and names[0] == "TcpExt:":
            out.update({n: int(v) for n, v in zip(names[1:], values[1:]) if n in WANTED})
    return out


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}

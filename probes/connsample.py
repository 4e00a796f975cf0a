"""Connections as the proxy counts them, sampled through the doctor's window.

A proxy's caps count connections, not fds, and the count moves faster than
one snapshot can catch: HAProxy's sessions are the client sockets it
accepted on its own listeners; an nginx worker's connections are every
socket it holds (clients, upstreams, listeners, its channel); Traffic
Server's throttle counts client and origin sockets. So every tick (0.25 s)
one dump of the TCP sockets in the target's network namespace (sock_diag, as
`ss -tan` reads it: core/tcpdiag.py) is matched by socket
inode against each process's /proc/PID/fd, giving per process: sockets,
accepted clients (sockets on one of its listening ports), upstreams, fds;
per listening port: the accept queue and its backlog; and the ephemeral
ports in use toward the namespace's busiest destination (TIME-WAIT ones once, at the
end: one dump of tens of thousands of them would let the sockets a process
holds change under it). Peaks over the samples go into the evidence. The same
dump carries each socket's TCP_INFO, from which probes/inflight.py tallies
where the proxy's requests are at each tick (the time budget's counts).

The TcpExt counters (ListenOverflows, ListenDrops) are the whole network
namespace's, so the listeners are also read with their own drop counter at
the window's start and end: tcp_listendrop() (include/net/tcp.h) adds one to
the listener's sk_drops for every SYN or handshake ACK it drops, accept
queue overflows included, and sock_diag reports it as SK_MEMINFO_DROPS
(sk_get_meminfo; `ss -m` prints it as skmem's `d` field). Which listener dropped is then known
even when its queue filled and emptied between two ticks; the other
processes' listeners whose queue a tick saw full are kept as well.

Between ticks a thread reads each process's open-fd count every FINE_S:
a worker's count can peak for milliseconds only (nginx's drain sawtooth
under bursts of reconnecting clients, see proxies/nginx.py), which 4 ticks a
second miss. It uses st_size of /proc/PID/fd, the number of open fds since
Linux 6.2 (fs/proc/fd.c proc_readfd_count): O(1) per read, no readlink. On
an older kernel it reads 0 and the fine peaks are reported unavailable.
"""

import os
import re
import threading

from proxytune.core import procfs, tcpdiag
from proxytune.core.numbers import uint
from proxytune.core.sockets import fd_inventory

from .inflight import Tally

TICK_S = 0.25
FINE_S = 0.01           # a worker at the top of nginx's tooth ~16 % of the time (measured) is seen there in a
                        # 3 s window unless 300 reads all miss it (0.84^300); each read wakes the doctor, and
                        # every wake-up can preempt the proxy on a busy host: 100/s, not 500/s


def namespace_of(pid: int | None) -> tcpdiag.Namespace | None:
    """A sock_diag reader in pid's network namespace; None when it cannot be had (the process is gone):
    every read is then empty, as an ss that failed was."""
    try:
        return tcpdiag.Namespace(pid)
    except OSError:
        return None


def _dump(ns: tcpdiag.Namespace | None, **how) -> list[tcpdiag.Sock] | None:
    if ns is None:
        return None
    try:
        return ns.dump(**how)
    except OSError:
        return None


def tcp_rows(ns: tcpdiag.Namespace | None, time_wait: bool = False,
             info: dict | None = None) -> list[tuple[str, int, int, str, int | None, str]]:
    """(state, recv-q, send-q, local port, inode, flow) of every TCP socket in the namespace, flow being
    "LOCAL-ADDRESS>PEER:PORT" (the 4-tuple less the local port); TIME-WAIT ones only
    when asked: under churn there are tens of thousands, and a dump that long lets the sockets a process
    holds change under it (no process holds a TIME-WAIT socket). With `info` (a dict), the same dump
    carries TCP_INFO, and info[inode] gets its fields (core/tcpdiag.py, under ss's names)."""
    states = tcpdiag.ALL_STATES if time_wait else tcpdiag.ALL_STATES & ~(1 << tcpdiag.TCP_TIME_WAIT)
    rows = []
    for s in _dump(ns, states=states, info=info is not None) or ():
        address, port = s.local.rsplit(":", 1)
        rows.append((s.state, s.recvq, s.sendq, port, s.inode or None, f"{address}>{s.peer}"))
        if info is not None and s.inode:
            info[s.inode] = s.info
    return rows


def busiest_destination(rows, listening: set[str], span: tuple[int, int]) -> tuple[int, str | None]:
    """(sockets, flow) of the destination that holds the most local ports of the ephemeral range. A
    connect() needs a 4-tuple no other socket has (__inet_check_established, net/ipv4/inet_hashtables.c),
    so each destination has the whole range to itself: the count per destination is what can run out,
    and it cannot exceed the range (a count over all destinations can)."""
    per: dict[str, int] = {}
    for state, _, _, port, _, flow in rows:
        # a socket with no local port yet (or none any more) is listed with port "*", as ss prints it
        if state != "LISTEN" and port not in listening and (n := uint(port)) is not None and span[0] <= n <= span[1]:
            per[flow] = per.get(flow, 0) + 1
    flow = max(per, key=per.get, default=None)
    return (per[flow], flow) if flow else (0, None)


def listener_drops(ns: tcpdiag.Namespace | None) -> dict[int, dict] | None:
    """Every TCP listener of the namespace by inode: its local address, accept queue, backlog and the drops the
    kernel counted on it (sk_drops); None when that cannot be read (no SK_MEMINFO_DROPS: an old kernel)."""
    socks = _dump(ns, states=1 << tcpdiag.TCP_LISTEN, memory=True)
    if socks is None or any(s.drops is None for s in socks):
        return None
    return {s.inode: {"local": s.local, "queued": s.recvq, "backlog": s.sendq, "drops": s.drops}
            for s in socks if s.inode}


def inode_owners(inodes: set[int]) -> dict[int, dict]:
    """inode -> {"pid", "comm"} of a process holding that socket, from every process's /proc/PID/fd (once, at
    the end, for the few listeners that are not the target's)."""
    out: dict[int, dict] = {}
    for pid in procfs.all_pids():
        if len(out) == len(inodes):
            break
        got = fd_inventory(pid)
        for ino in (got[1] & inodes) if got else ():
            out.setdefault(ino, {"pid": pid, "comm": procfs.comm_of(pid)})
    return out


def named_threads(pid: int, name: str) -> int:
    """Threads of pid whose name (comm) is `name`."""
    n = 0
    for tid in procfs.thread_ids(pid):
        try:
            with open(f"/proc/{int(pid)}/task/{tid}/comm", encoding="ascii", errors="replace") as fh:
                n += fh.read().strip() == name
        except OSError:
            continue
    return n


def parse_range(text: str | None) -> tuple[int, int] | None:
    m = re.fullmatch(r"\s*([0-9]+)\s+([0-9]+)\s*", text or "", re.A)
    return (int(m.group(1)), int(m.group(2))) if m else None


class FdPeaks:
    """Each pid's peak open-fd count, read every FINE_S on a thread of its own between start() and stop()."""

    def __init__(self, pids: list[int], every_s: float = FINE_S):
        self.pids, self.peak, self.every_s = list(pids), {p: 0 for p in pids}, every_s
        self.reads, self.reason = 0, None
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="fd-peaks")

    @staticmethod
    def count(pid: int) -> int | None:
        try:
            return os.stat(f"/proc/{int(pid)}/fd").st_size
        except OSError:
            return None

    def start(self) -> None:
        if not any(self.count(p) for p in self.pids):      # before Linux 6.2 st_size is 0
            self.reason = "st_size of /proc/PID/fd is 0: the open-fd count needs Linux 6.2 or later"
            return
        self.thread.start()

    def _run(self) -> None:
        while not self.halt.wait(self.every_s):
            for pid in self.pids:
                if (n := self.count(pid)) is not None and n > self.peak[pid]:
                    self.peak[pid] = n
            self.reads += 1

    def stop(self) -> None:
        self.halt.set()
        if self.thread.is_alive():
            self.thread.join(1)


class Sampler:
    """Call sample() every tick; summary() is the evidence."""

    def __init__(self, pids: list[int], port_range: str | None = None, thread_name: str | None = None,
                 tick_s: float = TICK_S, fine_s: float = FINE_S, standing: bool = False):
        self.pids = list(dict.fromkeys(pids))
        self.thread_name = thread_name          # count this proxy's worker threads (varnish: cache-worker)
        self.ns = namespace_of(self.pids[0]) if self.pids else None
        self.range = parse_range(port_range)
        self.standing = standing                 # a watcher's window: no walk of the hash at its end
        self.n = 0
        self.per_pid: dict[int, dict] = {}
        self.ports: dict[str, dict] = {}
        self.clients_peak = self.upstream_peak = self.ephemeral_peak = 0
        self.ephemeral_flow: str | None = None
        self.tick_s = tick_s                    # how often the caller calls sample(): stated in the summary
        self.fine = FdPeaks(self.pids, fine_s)
        self.other_fds: dict[int, int] = {}      # per pid: fewest fds that are not sockets over the ticks
        self.own_listeners: dict[int, str] = {}  # inode -> port of the target's listening sockets
        self.others: dict[int, dict] = {}        # inode -> the other processes' listeners, as the ticks saw them
        self.drops0 = self.drops1 = None         # listener_drops() at the window's start and end
        self.flight = Tally()                     # where its requests are at each tick (the time budget)
        self.established: dict | None = None     # the last tick's: established sockets held, clients among them

    def sample(self) -> None:
        if self.n == 0:
            self.fine.start()
            if self.drops0 is None:                  # else handed on by the window before (standing)
                self.drops0 = listener_drops(self.ns)
        inv = {p: got for p in self.pids if (got := fd_inventory(p)) is not None}
        owner: dict[int, list[int]] = {}
        for pid, (_, socks) in inv.items():
            for ino in socks:
                owner.setdefault(ino, []).append(pid)
        info: dict[int, dict] = {}
        rows = tcp_rows(self.ns, info=info)
        listening = {port for state, _, _, port, ino, _ in rows if state == "LISTEN" and ino in owner}
        counts = {pid: {"clients": 0, "upstream": 0} for pid in inv}
        self.established = {"clients": 0, "total": 0}
        for state, recvq, sendq, port, ino, flow in rows:
            if state == "ESTAB" and ino in owner:
                self.established["total"] += 1
                self.established["clients"] += port in listening
            if state == "LISTEN":
                if ino in owner:
                    self._listener(port, recvq, sendq)
                    self.own_listeners[ino] = port
                elif ino:
                    self._other(ino, f"{flow.split('>', 1)[0]}:{port}", recvq, sendq)
                continue
            for pid in owner.get(ino, ()):
                counts[pid]["clients" if port in listening else "upstream"] += 1
        for pid, (fds, socks) in inv.items():
            peak = self.per_pid.setdefault(pid, {"fds_peak": 0, "sockets_peak": 0, "clients_peak": 0,
                                                 "upstream_peak": 0})
            for key, v in (("fds_peak", fds), ("sockets_peak", len(socks)),
                           ("clients_peak", counts[pid]["clients"]), ("upstream_peak", counts[pid]["upstream"])):
                peak[key] = max(peak[key], v)
            # the fewest: an fd closed between listing and readlink looks like a non-socket
            self.other_fds[pid] = min(self.other_fds.get(pid, fds), fds - len(socks))
        self.clients_peak = max(self.clients_peak, sum(c["clients"] for c in counts.values()))
        self.upstream_peak = max(self.upstream_peak, sum(c["upstream"] for c in counts.values()))
        self._clients_by_port(rows, owner, listening)
        self.flight.tick(rows, owner, listening, info)
        if self.range:
            eph, flow = busiest_destination(rows, listening, self.range)
            if eph > self.ephemeral_peak:
                self.ephemeral_peak, self.ephemeral_flow = eph, flow
        if self.thread_name:
            for pid in inv:
                peak = self.per_pid[pid]
                peak["workers_peak"] = max(peak.get("workers_peak", 0), named_threads(pid, self.thread_name))
        self.n += 1

    def _listener(self, port: str, queued: int, backlog: int) -> None:
        r = self.ports.setdefault(port, {"queued_peak": 0, "queued_samples": 0, "backlog": backlog,
                                         "clients_peak": 0})
        r["queued_peak"] = max(r["queued_peak"], queued)
        r["queued_samples"] += queued > 0
        r["backlog"] = backlog

    def _other(self, ino: int, local: str, queued: int, backlog: int) -> None:
        """Another process's listener in the namespace: its queue's peak and the ticks that saw it full."""
        r = self.others.setdefault(ino, {"local": local, "queued_peak": 0, "full_samples": 0, "backlog": backlog})
        r["queued_peak"] = max(r["queued_peak"], queued)
        r["full_samples"] += queued >= backlog > 0
        r["backlog"] = backlog

    def window_end(self) -> None:
        """The listeners' drop counters at the window's end (with the TcpExt counters they are set against)."""
        self.drops1 = listener_drops(self.ns)

    def listen_drops(self) -> dict:
        """Each listener's drops in the window: the target's per port (into self.ports), and the other
        listeners of the namespace that dropped or were seen full, with the process that holds them."""
        if self.drops0 is None or self.drops1 is None:
            return {"available": False, "reason": "the kernel gave no per-listener drop count (sock_diag SK_MEMINFO_DROPS) here",
                    "others": self._others({})}
        delta = {ino: r["drops"] - self.drops0.get(ino, {}).get("drops", 0) for ino, r in self.drops1.items()}
        for ino, port in self.own_listeners.items():
            if port in self.ports:
                self.ports[port]["drops"] = self.ports[port].get("drops", 0) + max(0, delta.get(ino, 0))
        for ino, r in self.drops1.items():
            if ino not in self.own_listeners and delta[ino] > 0:
                self.others.setdefault(ino, {"local": r["local"], "queued_peak": r["queued"], "full_samples": 0,
                                             "backlog": r["backlog"]})
        return {"available": True, "counted": "each listener's sk_drops (sock_diag SK_MEMINFO_DROPS) from the window's start "
                                              "to its end", "others": self._others(delta)}

    def _others(self, delta: dict[int, int]) -> list[dict]:
        """The other listeners that dropped (by their own count) or that a tick saw full, busiest first."""
        seen = {ino: {**r, "drops": delta.get(ino)} for ino, r in self.others.items()
                if r["full_samples"] or (delta.get(ino) or 0) > 0}
        owners = inode_owners(set(seen)) if seen else {}
        out = [{**r, "process": owners.get(ino)} for ino, r in seen.items()]
        return sorted(out, key=lambda r: (-(r["drops"] or 0), -r["full_samples"]))[:8]

    def _clients_by_port(self, rows, owner, listening) -> None:
        per: dict[str, int] = {}
        for state, _, _, port, ino, _ in rows:
            if state != "LISTEN" and port in listening and ino in owner:
                per[port] = per.get(port, 0) + 1
        for port, n in per.items():
            if port in self.ports:
                self.ports[port]["clients_peak"] = max(self.ports[port]["clients_peak"], n)

    def ephemeral_now(self) -> tuple[int | None, str | None]:
        """Ephemeral ports in use toward the busiest destination now, TIME-WAIT included (one full dump)."""
        if not self.range or self.standing:
            return None, None
        rows = tcp_rows(self.ns, time_wait=True)
        return busiest_destination(rows, {port for state, _, _, port, _, _ in rows if state == "LISTEN"}, self.range)

    def fine_peaks(self) -> dict:
        """Per pid the peak fd count read every FINE_S, and the sockets among them at that peak: the fds
        that are not sockets (its files, epoll and event fds, logs) taken as the fewest seen at any tick."""
        self.fine.stop()
        if self.fine.reason:
            return {"available": False, "reason": self.fine.reason}
        for pid, n in self.fine.peak.items():
            if pid in self.per_pid and n:
                self.per_pid[pid]["fds_peak_fine"] = n
                self.per_pid[pid]["sockets_peak_fine"] = max(0, n - self.other_fds.get(pid, 0))
        return {"available": True, "every_s": self.fine.every_s, "reads": self.fine.reads}

    def summary(self) -> dict:
        size = self.range[1] - self.range[0] + 1 if self.range else None
        fine = self.fine_peaks()
        if self.drops1 is None and self.n:
            self.window_end()
        drops = self.listen_drops()
        ephemeral = self.ephemeral(size)
        if self.ns is not None:
            self.ns.close()                     # the window's last read: its netlink socket goes now, not at GC
            self.ns = None
        return {"samples": self.n, "tick_s": self.tick_s, "fine": fine, "pids": {str(p): v for p, v in self.per_pid.items()},
                "ports": self.ports, "clients_peak": self.clients_peak, "upstream_peak": self.upstream_peak,
                "ephemeral": ephemeral, "listen_drops": drops, "flight": self.flight.summary()}

    def ephemeral(self, size: int | None) -> dict:
        at_end, flow = self.ephemeral_now()
        return {"peak_connected": self.ephemeral_peak, "peak_toward": self.ephemeral_flow,
                "at_end_with_time_wait": at_end, "at_end_toward": flow, "range_size": size,
                "counted": "local ports of the range toward one destination (the busiest): each has the whole range"}

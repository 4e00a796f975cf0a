"""Where the proxy's requests are at each of connsample's ticks, read from
the kernel's own per-socket state (sock_diag TCP_INFO, as `ss -tiO` prints
it), for the time budget's Little's-law parts: the mean number of requests
found in a state, divided by the request rate, is the mean time a request
spends in it (L = λW), whatever the distribution.

Per tick, over the sockets the proxy holds (matched by inode):
- accept queue: each listener's Recv-Q (connections not accepted yet);
- client data the proxy has not read: client sockets with Recv-Q > 0;
- origin connecting: upstream sockets in SYN-SENT, per origin;
- awaiting the origin: upstream sockets that sent a request the origin has
  not begun to answer (below), per origin;
- origin data the proxy has not read: upstream sockets with Recv-Q > 0.

"Awaiting" from TCP_INFO (net/ipv4/tcp.c tcp_get_info): last_data_sent and
last_data_recv are jiffies since the last data segment sent (tp->lsndtime)
and received (icsk_ack.lrcvtime), last_ack_recv since the last ACK
(tp->rcv_tstamp), all of 1000/HZ ms resolution. A socket with Recv-Q 0 that
has sent data awaits its origin when it has received nothing yet (a fresh
connection: ss omits bytes_received), or its last send is newer than its
last receipt, or both fall in one jiffy (a request sent right after the
previous answer, as keep-alive reuse does under load) and the origin has
not acknowledged it (unacked) or acknowledged it on its own later (delayed
ACK, at least 40 ms: TCP_DELACK_MIN). What TCP_INFO cannot tell apart is
counted as "ambiguous": data sent and received, and the last ACK, all in
one jiffy. That is a request sent right after the previous answer and
acknowledged at once (an origin idle for longer than its RTO acknowledges
in quick-ACK mode: tcp_event_data_recv, net/ipv4/tcp_input.c), still
awaiting; or a request answered within that jiffy, idle since. The budget
takes the awaiting count as the lower bound and awaiting + ambiguous as
the upper one.
"""

def ambiguous(info: dict[str, int]) -> bool:
    """Not awaiting by awaiting(), yet maybe awaiting: sent, received and acknowledged in one jiffy."""
    snd, rcv = info.get("lastsnd", 0), info.get("lastrcv", 0)
    return bool(info.get("bytes_sent")) and bool(info.get("bytes_received")) and snd == rcv \
        and not awaiting(info)


def awaiting(info: dict[str, int]) -> bool:
    """An upstream socket with nothing unread: has it sent a request its origin has not begun to answer?"""
    if not info.get("bytes_sent"):
        return False
    if not info.get("bytes_received"):
        return True
    snd, rcv = info.get("lastsnd", 0), info.get("lastrcv", 0)
    if snd != rcv:
        return snd < rcv
    return info.get("unacked", 0) > 0 or info.get("lastack", 0) < rcv


def origin_of(flow: str) -> str:
    """"LOCAL>PEER:PORT" -> "PEER:PORT", the way the budget keys origins (IPv6 in brackets, as ss prints)."""
    peer = flow.split(">", 1)[-1]
    if peer.startswith("[::ffff:") and "." in peer:          # a v4-mapped peer of a v6 socket: its v4 form
        addr, _, port = peer.rpartition(":")
        return f"{addr[8:-1]}:{port}"
    return peer


MAX_TICKS_KEPT = 4096      # a window of ~0.25 s ticks: 17 minutes of per-tick counts


def _host(flow: str) -> str:
    """A row's local address as one spelling: tcp_rows brackets v6 ones ("[::]", "[::ffff:127.0.0.1]"), and a
    dual-stack listener's v4 clients are v4-mapped."""
    return flow.split(">", 1)[0].strip("[]").removeprefix("::ffff:")


class Tally:
    """Sums over the ticks of each state's count; summary() is the evidence (means are sums / ticks)."""

    def __init__(self):
        self.ticks = 0
        self.accept: dict[str, int] = {}
        # the connections in the proxy's accept queues at the latest tick, (port, 4-tuple) -> the ticks in a
        # row they have been seen there: as many as there were ticks, they waited through the window
        self.unaccepted: dict[tuple[str, str], int] = {}
        self.client_unread = 0
        self.client_unread_ticks: list[int] = []    # per tick: its spread bounds the mean (arrivals come in bursts)
        self.ties = 0
        self.origins: dict[str, dict[str, int]] = {}
        self.segs: dict[int, list[int]] = {}     # client socket inode -> [data segments in at first sight, last]
        self.up_segs: dict[int, list[int]] = {}  # upstream socket inode -> [data segments out, the same]
        self.before: set[int] = set()            # sockets already there at the first tick

    def _origin(self, flow: str) -> dict[str, int]:
        return self.origins.setdefault(origin_of(flow), {"connecting": 0, "awaiting": 0, "ambiguous": 0,
                                                         "unread": 0, "sockets": 0})

    def tick(self, rows, owner: dict, listening: set[str], info: dict[int, dict]) -> None:
        """One tick of connsample's rows, the inode -> pids map of the proxy's sockets, its listening
        ports and each socket's TCP_INFO fields by inode (tcp_rows(..., info=): a field at 0 is left out)."""
        before = self.client_unread
        self._unaccepted(rows, owner, listening)
        for state, recvq, _, port, ino, flow in rows:
            if ino not in owner:
                continue
            got = info.get(ino) or {}
            if state == "LISTEN":
                self.accept[port] = self.accept.get(port, 0) + recvq
            elif port in listening:
                self.client_unread += recvq > 0
                self._segments(self.segs, ino, got.get("data_segs_in", 0))
            elif state == "SYN-SENT":
                self._origin(flow)["connecting"] += 1
            elif state == "ESTAB":
                self._segments(self.up_segs, ino, got.get("data_segs_out", 0))
                o = self._origin(flow)
                o["sockets"] += 1
                if recvq > 0:
                    o["unread"] += 1
                    continue
                if awaiting(got):
                    o["awaiting"] += 1
                    self.ties += got.get("lastsnd") == got.get("lastrcv") and bool(got.get("bytes_received"))
                elif ambiguous(got):
                    o["ambiguous"] += 1
        self.client_unread_ticks.append(self.client_unread - before)
        self.ticks += 1

    def _unaccepted(self, rows, owner: dict, listening: set[str]) -> None:
        """The connections waiting in the proxy's accept queues at this tick: an established socket no
        process holds (inode 0: accept() has not made it a file yet) on an address and port one of the
        proxy's listeners takes (its own, or a wildcard). Tracked by 4-tuple, so a stalled worker's queue is
        told from a busy one's on the same port (reuseport) and another server's on the same port apart."""
        takes = {(_host(flow), port) for state, _, _, port, ino, flow in rows if state == "LISTEN" and ino in owner}
        wild = {port for address, port in takes if address in ("0.0.0.0", "::")}
        now: dict[str, set[str]] = {}
        for state, _, _, port, ino, flow in rows:
            if state == "ESTAB" and ino is None and port in listening and (port in wild or (_host(flow), port) in takes):
                now.setdefault(port, set()).add(flow)
        self.unaccepted = {(port, f): self.unaccepted.get((port, f), 0) + 1 for port, flows in now.items() for f in flows}

    def _unaccepted_summary(self) -> dict:
        out: dict[str, dict[str, int]] = {"through_every_tick": {}, "at_last_tick": {}, "at_last_tick_ticks": {}}
        for (port, _), n in self.unaccepted.items():
            if n == self.ticks:
                out["through_every_tick"][port] = out["through_every_tick"].get(port, 0) + 1
            out["at_last_tick"][port] = out["at_last_tick"].get(port, 0) + 1
            # ticks those still queued at the last tick spent queued: no request of theirs was served in the window
            out["at_last_tick_ticks"][port] = out["at_last_tick_ticks"].get(port, 0) + n
        return out

    def _segments(self, segs: dict, ino: int, n: int) -> None:
        if self.ticks == 0:
            self.before.add(ino)
        seen = segs.setdefault(ino, [n, n])
        seen[1] = max(seen[1], n)

    def _grown(self, segs: dict) -> int:
        """A socket there at the first tick counts from its count then, one born later from 0."""
        return sum(last - (first if ino in self.before else 0) for ino, (first, last) in segs.items())

    def client_segments(self) -> dict:
        """Data segments the proxy's client sockets received in the window, as far as the ticks saw them; a
        connection opened and closed between two ticks is not seen (the budget adds the kernel's count of new
        connections)."""
        return {"data_segments_in": self._grown(self.segs), "sockets_seen": len(self.segs),
                "sockets_born_in_window": len(self.segs) - len(self.before & self.segs.keys())}

    def upstream_segments(self) -> dict:
        """Data segments the proxy sent on its established upstream sockets in the window (a request that fits
        in one segment is one), as the ticks saw them: the exchanges per request of origin_wait.bt's waits."""
        return {"data_segments_out": self._grown(self.up_segs), "sockets_seen": len(self.up_segs),
                "sockets_born_in_window": len(self.up_segs) - len(self.before & self.up_segs.keys())}

    def summary(self) -> dict:
        return {"ticks": self.ticks, "accept_queued_sum": self.accept,
                "unaccepted": self._unaccepted_summary(),
                "client_unread_sum": self.client_unread,
                "client_unread_per_tick": self.client_unread_ticks[:MAX_TICKS_KEPT],
                "origins": self.origins, "awaiting_in_one_jiffy": self.ties, "clients": self.client_segments(),
                "upstream": self.upstream_segments(),
                "counted": "sums over the ticks of sockets the proxy holds in each state (mean = sum / ticks)"}

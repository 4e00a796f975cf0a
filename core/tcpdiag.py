"""TCP sockets of a network namespace, read in process from the kernel's
sock_diag netlink interface: what `ss -tan` reads (misc/ss.c, inet_show_netlink),
without a process per read. The watcher samples every second for months; an
`ss` exec (with `nsenter` in front of it for a proxy in another namespace)
costs 2 to 9 ms of CPU each time here, more than the rest of its work.

A netlink socket belongs to the network namespace it was created in
(net/netlink/af_netlink.c: sock_net of the socket), so one is made once in the
target's namespace, by a short-lived thread that enters it (setns(2) moves
the calling thread only), and is kept. Per socket: state, the queues ss prints
as Recv-Q and Send-Q (for a listener, its accept queue and backlog:
inet_diag_msg idiag_rqueue/idiag_wqueue, net/ipv4/tcp_diag.c tcp_diag_get_info),
the addresses, the inode, the TCP_INFO fields probes/inflight.py reads, under
the names ss prints them with, and the drops counted on it (SK_MEMINFO_DROPS,
ss -m's `d`).
"""

import os
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from . import netns
from .netlink import NETLINK_SOCK_DIAG, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, SOCK_DIAG_BY_FAMILY, \
    messages

INET_DIAG_INFO, INET_DIAG_SKMEMINFO = 2, 7                      # linux/inet_diag.h
SK_MEMINFO_DROPS = 8                                            # linux/sock_diag.h
TCP_ESTABLISHED, TCP_TIME_WAIT, TCP_LISTEN = 1, 6, 10
ALL_STATES = (1 << 13) - 1                                      # TCP_ESTABLISHED (1) .. TCP_NEW_SYN_RECV (12)
STATE_NAMES = {1: "ESTAB", 2: "SYN-SENT", 3: "SYN-RECV", 4: "FIN-WAIT-1", 5: "FIN-WAIT-2", 6: "TIME-WAIT",
               7: "UNCONN", 8: "CLOSE-WAIT", 9: "LAST-ACK", 10: "LISTEN", 11: "CLOSING", 12: "SYN-RECV"}
REQUEST = struct.Struct("=BBBxI48x")                          # inet_diag_req_v2 (its sockid zeroed: any)
MESSAGE = struct.Struct("=BBBB2H16s16sI8xIIIII")                # inet_diag_msg
# struct tcp_info (linux/tcp.h): byte offset of each field probes/inflight.py uses, with ss's name for it
TCP_INFO_FIELDS = {"unacked": (24, "I"), "lastsnd": (44, "I"), "lastrcv": (52, "I"), "lastack": (56, "I"),
                   "bytes_received": (128, "Q"), "data_segs_in": (152, "I"),
                   "data_segs_out": (156, "I"), "bytes_sent": (200, "Q")}
RECV_BYTES = 1 << 17
_FIELD_STRUCTS = {name: (off, struct.Struct("=" + fmt)) for name, (off, fmt) in TCP_INFO_FIELDS.items()}


class TcpInfo(Mapping):
    """A socket's TCP_INFO fields, decoded on first look: a dump carries every socket of the namespace
    and the sampler looks only at the proxy's (a watcher reads one every few seconds for months). As
    ss, a field at 0 is left out, and so is one an older kernel's shorter struct lacks."""

    def __init__(self, raw: bytes = b""):
        self.raw = raw

    @cached_property
    def _fields(self) -> dict[str, int]:
        out, raw = {}, self.raw
        for name, (off, st) in _FIELD_STRUCTS.items():
            if len(raw) >= off + st.size and (v := st.unpack_from(raw, off)[0]):
                out[name] = v
        return out

    def __getitem__(self, key: str) -> int:
        return self._fields[key]

    def __iter__(self):
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return repr(self._fields)


@dataclass
class Sock:
    state: str
    recvq: int
    sendq: int
    local: str              # as ss -n prints it: 127.0.0.1:8080, [::1]:8080, 0.0.0.0:*
    peer: str
    inode: int
    info: Mapping[str, int] = field(default_factory=dict)
    drops: int | None = None


def _address(family: int, raw: bytes, port: int) -> str:
    text = socket.inet_ntop(family, raw[:4] if family == socket.AF_INET else raw)
    return f"{text if family == socket.AF_INET else '[' + text + ']'}:{port or '*'}"


_ATTR = struct.Struct("=HH")


def _attributes(data: bytes, at: int = 0):
    """(kind, payload) of each netlink attribute from offset `at` (4-byte aligned, as NLA_ALIGN)."""
    while len(data) - at >= 4:
        alen, kind = _ATTR.unpack_from(data, at)
        if alen < 4:
            return
        yield kind, data[at + 4:at + alen]
        at += (alen + 3) & ~3


def parse(family: int, body: bytes) -> Sock | None:
    """One inet_diag_msg and its attributes; None when it is too short to be one."""
    if len(body) < MESSAGE.size:
        return None
    _, state, _, _, sport, dport, src, dst, _, _, rq, wq, _, ino = MESSAGE.unpack_from(body)
    s = Sock(STATE_NAMES.get(state, str(state)), rq, wq, _address(family, src, socket.ntohs(sport)),
             _address(family, dst, socket.ntohs(dport)), ino)
    for kind, attr in _attributes(body, MESSAGE.size):
        if kind == INET_DIAG_INFO:
            s.info = TcpInfo(attr)
        elif kind == INET_DIAG_SKMEMINFO and len(attr) >= 4 * (SK_MEMINFO_DROPS + 1):
            s.drops = struct.unpack_from("=I", attr, 4 * SK_MEMINFO_DROPS)[0]
    return s


class Namespace:
    """A sock_diag socket in the network namespace pid is in (ours when pid is None); dump() reads it.
    OSError when the namespace cannot be entered (the process is gone, or we lack CAP_SYS_ADMIN)."""

    def __init__(self, pid: int | None = None):
        self.seq = 0
        self.proc = f"/proc/{int(pid)}" if pid is not None else "/proc/thread-self"
        self.nl = netns.run_in(pid, diag_socket)

    def families(self, states: int) -> list[int]:
        """The address families worth a dump. A dump walks the kernel's whole established-socket hash,
        shared by every namespace and sized by RAM (262,144 buckets, 2 ms a walk, here), whatever the
        namespace holds: a family whose sockets this namespace counts at 0 (/proc/net/sockstat's
        `inuse`, per namespace: sock_prot_inuse_get) is skipped. TIME-WAIT sockets are not in that
        count (the v4 line's `tw` counts both families'), so a dump of them takes both."""
        if states & (1 << TCP_TIME_WAIT):
            return [socket.AF_INET, socket.AF_INET6]
        out = []
        for family, name, label in ((socket.AF_INET, "sockstat", "TCP:"), (socket.AF_INET6, "sockstat6", "TCP6:")):
            try:
                with open(f"{self.proc}/net/{name}", encoding="ascii", errors="replace") as fh:
                    line = next((l.split() for l in fh if l.startswith(label + " ")), [])
            except OSError:
                line = []
            inuse = line[line.index("inuse") + 1] if "inuse" in line[:-1] else None
            if inuse != "0":
                out.append(family)
        return out

    def dump(self, states: int = ALL_STATES & ~(1 << TCP_TIME_WAIT), info: bool = False,
             memory: bool = False) -> list[Sock]:
        """Every TCP socket (IPv4 and IPv6) in one of `states` (a bit per TCP state); TCP_INFO and the
        drop count when asked."""
        ext = (1 << (INET_DIAG_INFO - 1) if info else 0) | (1 << (INET_DIAG_SKMEMINFO - 1) if memory else 0)
        out = []
        for family in self.families(states):
            out += self._dump_family(family, states, ext)
        return out

    def _dump_family(self, family: int, states: int, ext: int) -> list[Sock]:
        self.seq += 1
        req = REQUEST.pack(family, socket.IPPROTO_TCP, ext, states)
        self.nl.send(struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP,
                                 self.seq, 0) + req)
        out = []
        while True:
            for kind, seq, body in messages(self.nl.recv(RECV_BYTES)):
                if seq != self.seq:
                    continue                            # the tail of a dump an earlier error cut short
                if kind == NLMSG_ERROR:
                    err = -struct.unpack_from("=i", body)[0] if len(body) >= 4 else 0
                    if err:
                        raise OSError(err, f"sock_diag: {os.strerror(err)}")
                    return out
                if kind == NLMSG_DONE:
                    return out
                if (s := parse(family, body)) is not None:
                    out.append(s)

    def close(self) -> None:
        self.nl.close()


EXACT = struct.Struct("=BBBxI2H16s16sI8s")                  # inet_diag_req_v2 naming one socket
NO_COOKIE = b"\xff" * 8                                       # INET_DIAG_NOCOOKIE: look it up by address


def owner_uid(local: tuple, remote: tuple) -> int | None:
    """The uid owning the TCP socket of this (our) namespace whose local end is `local` and peer
    `remote` ((address, port) each): for a connection accepted here, the client's socket is the one
    with local = its peer, remote = our end (inet_diag_find_one_icsk looks the id up as a packet to
    it would be). None when there is none here (a remote client) or it cannot be told."""
    try:
        family = socket.AF_INET6 if ":" in local[0] else socket.AF_INET
        src, dst = (socket.inet_pton(family, a) for a in (local[0], remote[0]))
    except (OSError, ValueError, TypeError, IndexError):
        return None
    req = EXACT.pack(family, socket.IPPROTO_TCP, 0, ALL_STATES, socket.htons(local[1]), socket.htons(remote[1]),
                     src.ljust(16, b"\0"), dst.ljust(16, b"\0"), 0, NO_COOKIE)
    try:
        with diag_socket() as nl:
            nl.send(struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + req)
            for kind, _, body in messages(nl.recv(RECV_BYTES)):
                if kind == SOCK_DIAG_BY_FAMILY and len(body) >= MESSAGE.size:
                    return MESSAGE.unpack_from(body)[-2]
                return None                             # NLMSG_ERROR: ENOENT, no such socket here
    except OSError:
        return None
    return None


def diag_socket() -> socket.socket:
    """A sock_diag socket in the calling thread's network namespace; a kernel that does not answer
    within 5 s is an OSError (socket.timeout), not a watcher stuck for good."""
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
    nl.settimeout(5)
    return nl

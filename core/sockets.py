"""The sockets a watched process holds, found by inode, and the only calls
the doctor makes to them. A socket counts as the target's only when one of
its processes holds it (socket:[INODE] in /proc/PID/fd): a stats socket or
status port the config names but the target does not hold (root's own
service, another user's listener) is never contacted, and no process can
lend its listener to another by its name (ss prints comm verbatim, so a
process named `pid=1234` could). Every call has one total deadline, on the
monotonic clock, across connect, send and every receive.
"""

import ipaddress
import os
import re
import socket
import stat
import struct
import time

from proxytune.core import netlink, netns, procfs, tcpdiag

MAX_REPLY = 1 << 20
TCP_LISTEN = "0A"
UDIAG_SHOW_VFS, UNIX_DIAG_VFS = 0x2, 1           # linux/unix_diag.h


class Deadline:
    """One budget of seconds for a whole exchange; `left()` raises TimeoutError once spent."""

    def __init__(self, seconds: float):
        self.seconds, self.end = seconds, time.monotonic() + seconds
        self.missed = f"no complete answer within its {seconds:g} s deadline"

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError(self.missed)
        return left


def fd_inventory(pid: int, proc: int | None = None) -> tuple[int, set[int]] | None:
    """(open fds, inodes of the sockets among them: socket:[INODE] in /proc/PID/fd); None when gone.
    With `proc` (an open /proc/PID) it is read through that: never a recycled pid's."""
    try:
        fd_dir = os.open("fd" if proc is not None else f"/proc/{int(pid)}/fd",
                         os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
    except (OSError, ValueError):
        return None
    socks = set()
    try:
        names = os.listdir(fd_dir)
        for fd in names:
            try:
                link = os.readlink(fd, dir_fd=fd_dir)
            except OSError:
                continue
            if m := re.fullmatch(r"socket:\[([0-9]+)\]", link, re.A):
                socks.add(int(m.group(1)))
    except OSError:
        return None
    finally:
        os.close(fd_dir)
    return len(names), socks


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets pid holds open; empty when gone."""
    got = fd_inventory(pid)
    return got[1] if got else set()


def held(pids: list[int], proc: int | None = None) -> set[int]:
    """Inodes of the sockets the pids and every process below them hold (a worker holds what its master named).
    With `proc` (an open /proc/PID of pids[0]) the first pid's own are read through it, and nothing is
    held once that process is gone: a recycled pid's sockets never count."""
    if proc is not None:
        own = fd_inventory(pids[0], proc)
        if own is None:
            return set()
        return own[1] | set().union(*(socket_inodes(d) for p in pids for d in procfs.descendants(p) if d != pids[0]))
    return set().union(*(socket_inodes(d) for p in pids for d in procfs.descendants(p)))


def _table(pid: int, name: str) -> list[str]:
    try:
        with open(f"/proc/{int(pid)}/net/{name}", encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()[1:]
    except OSError:
        return []


def listening_unix_files(inodes: set[int], pid: int | None = None) -> set[tuple[int, int, int]]:
    """(major, minor, inode) of the socket files the listening unix sockets among `inodes` are
    bound to, from sock_diag (UNIX_DIAG_VFS): the file's identity, whatever name it has now. Unix
    sockets belong to a network namespace (net/unix/diag.c dumps sock_net's only), so the dump is
    asked in pid's: a proxy in a container's namespace holds its stats socket there."""
    req = struct.pack("BBHIIIII", socket.AF_UNIX, 0, 0, 1 << 10, 0, UDIAG_SHOW_VFS, 0, 0)   # TCP_LISTEN
    out = set()
    with netns.run_in(pid, tcpdiag.diag_socket) as nl:
        nl.send(struct.pack("IHHII", 16 + len(req), netlink.SOCK_DIAG_BY_FAMILY,
                            netlink.NLM_F_REQUEST | netlink.NLM_F_DUMP, 1, 0) + req)
        while True:
            for kind, _, body in netlink.messages(nl.recv(1 << 16)):
                if kind in (netlink.NLMSG_DONE, netlink.NLMSG_ERROR):
                    return out
                ino, attrs = struct.unpack_from("I", body, 4)[0], body[16:]
                while len(attrs) >= 4:
                    alen, atype = struct.unpack_from("HH", attrs)
                    if atype == UNIX_DIAG_VFS and ino in inodes and alen >= 12:
                        vino, vdev = struct.unpack_from("II", attrs, 4)
                        out.add((vdev >> 20, vdev & 0xFFFFF, vino))        # the kernel's dev_t: 12/20 bits
                    attrs = attrs[(alen + 3) & ~3:] if alen >= 4 else b""


def held_file(pid: int, fd: int, proc: int | None = None) -> bool:
    """The socket file open as fd is one a listening socket of the target's is bound to."""
    st = os.fstat(fd)
    return stat.S_ISSOCK(st.st_mode) and \
        (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) in listening_unix_files(held([pid], proc), pid)


def _address(hexaddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of /proc/net/tcp{,6}: the kernel's words, each in host (little-endian) order."""
    raw = bytes.fromhex(hexaddr)
    return ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))


def holds_tcp(pid: int, host: str, port: int, proc: int | None = None) -> bool:
    """The target listens where a connection to host:port lands: on that address or on the
    wildcard (no other user can listen on host:port beside a wildcard listener of the target's)."""
    want = ipaddress.ip_address(host)
    mine = held([pid], proc)
    for line in _table(pid, "tcp" if want.version == 4 else "tcp6"):
        f = line.split()
        if len(f) > 9 and f[3] == TCP_LISTEN and int(f[9]) in mine:
            addr, _, hexport = f[1].partition(":")
            if int(hexport, 16) == port and _address(addr) in (want, ipaddress.ip_address("::" if want.version == 6
                                                                                          else "0.0.0.0")):
                return True
    return False


def _exchange(s: socket.socket, request: bytes, deadline: Deadline) -> bytes:
    """Send request, then read to EOF (or MAX_REPLY), every step within what is left of the deadline."""
    data = b""
    try:
        s.settimeout(deadline.left())
        s.sendall(request)
        while len(data) < MAX_REPLY:
            s.settimeout(deadline.left())
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        raise TimeoutError(deadline.missed) from None
    return data[:MAX_REPLY]


def unix_query(pid: int, path: str, request: bytes, deadline: Deadline, proc: int | None = None) -> bytes:
    """Send `request` to the target's unix socket at `path`; its reply. The socket file is opened
    (O_PATH, the last component not followed), must be one the target listens on (by its inode,
    not its name), and is connected through that descriptor: a path swapped for a link, or a
    directory swapped for one, to someone else's socket is never reached."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    try:
        if not held_file(pid, fd, proc):
            raise PermissionError(f"{path} is not held by pid {pid}: not contacted")
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(deadline.left())
            s.connect(f"/proc/self/fd/{fd}")
            return _exchange(s, request, deadline)
    finally:
        os.close(fd)


def http_get(host: str, port: int, path: str, deadline: Deadline) -> tuple[int, str]:
    """(status, body) of one HTTP/1.0 GET, within the deadline; the body decoded with replacement."""
    with socket.create_connection((host, port), timeout=deadline.left()) as s:
        raw = _exchange(s, f"GET {path} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode(), deadline)
    head, _, body = raw.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.[01] ([0-9]{3})", head, re.A)
    if not m:
        raise ConnectionError("the answer is not HTTP")
    return int(m.group(1)), body.decode(errors="replace")


def owners(pids: list[int]) -> dict[int, list[int]]:
    """socket inode -> the pids (of `pids`) holding it."""
    out: dict[int, list[int]] = {}
    for pid in pids:
        for ino in socket_inodes(pid):
            out.setdefault(ino, []).append(pid)
    return out


def _dump(pid: int, states: int, ns: "tcpdiag.Namespace | None" = None) -> list:
    """The TCP sockets in `states` of pid's network namespace (through `ns` when the caller holds one
    for it); none when it cannot be read."""
    try:
        own = ns is None
        ns = tcpdiag.Namespace(pid) if own else ns
    except OSError:
        return []
    try:
        return ns.dump(states=states)
    except OSError:
        return []
    finally:
        if own:
            ns.close()


def listeners(pids: list[int], ns: "tcpdiag.Namespace | None" = None) -> list[dict]:
    """The pids' listening TCP sockets with their accept queue and backlog, attributed by inode."""
    own = owners(pids)
    if not own:
        return []
    return [{"local": s.local, "queued": s.recvq, "backlog": s.sendq, "pids": sorted(own[s.inode])}
            for s in _dump(pids[0], 1 << tcpdiag.TCP_LISTEN, ns) if s.inode in own]


def connections(ports: set[str], pids: list[int], ns: "tcpdiag.Namespace | None" = None) -> dict:
    """Established TCP connections the pids hold: `clients` on `ports` (their listening ports), `total`."""
    own, n = owners(pids), {"clients": 0, "total": 0}
    for s in _dump(pids[0], 1 << tcpdiag.TCP_ESTABLISHED, ns) if own else ():
        if s.inode in own:
            n["total"] += 1
            n["clients"] += s.local.rsplit(":", 1)[-1] in ports
    return n

"""core/tcpdiag.py against the kernel: sockets this test makes, in a network namespace of its own
(nothing else's sockets to confuse), read as ss would print them; a namespace entered by pid; a
family with no socket is not walked; an older kernel's shorter TCP_INFO."""

import os
import socket
import struct
import subprocess
import sys

import pytest

from conftest import needs_root, wait_for
from proxytune.core import tcpdiag

pytestmark = needs_root


@pytest.fixture
def netns():
    import generic_cells as g
    with g.netns():
        yield


def by_inode(socks, s: socket.socket) -> tcpdiag.Sock:
    ino = os.fstat(s.fileno()).st_ino
    return next(x for x in socks if x.inode == ino)


def test_a_listener_its_queue_and_a_connection_with_its_tcp_info(netns):
    with socket.socket() as lst, socket.socket() as cli:
        lst.bind(("127.0.0.1", 0))
        lst.listen(7)
        port = lst.getsockname()[1]
        cli.connect(("127.0.0.1", port))
        cli.sendall(b"x" * 100)
        ns = tcpdiag.Namespace()
        assert wait_for(lambda: by_inode(ns.dump(), lst).recvq == 1, 5)      # one connection not accepted yet
        socks = ns.dump(info=True)
        l, c = by_inode(socks, lst), by_inode(socks, cli)
        assert (l.state, l.sendq, l.local, l.peer) == ("LISTEN", 7, f"127.0.0.1:{port}", "0.0.0.0:*")
        assert (c.state, c.peer) == ("ESTAB", f"127.0.0.1:{port}") and c.local.startswith("127.0.0.1:")
        assert c.info["bytes_sent"] == 100 and "bytes_received" not in c.info      # a zero is left out, as ss does
        assert l.drops is None and by_inode(ns.dump(memory=True), lst).drops == 0
        srv, _ = lst.accept()
        with srv:
            assert wait_for(lambda: by_inode(ns.dump(), srv).recvq == 100, 5)   # its unread bytes, as ss's Recv-Q


def test_a_family_without_sockets_is_not_walked_and_ipv6_reads_like_ss(netns):
    ns = tcpdiag.Namespace()
    assert ns.families(tcpdiag.ALL_STATES & ~(1 << tcpdiag.TCP_TIME_WAIT)) == []
    assert ns.families(tcpdiag.ALL_STATES) == [socket.AF_INET, socket.AF_INET6]     # TIME-WAIT: both, always
    with socket.socket(socket.AF_INET6) as six:
        six.bind(("::1", 0))
        six.listen(3)
        assert ns.families(1 << tcpdiag.TCP_LISTEN) == [socket.AF_INET6]
        s = by_inode(ns.dump(), six)
        assert (s.local, s.peer, s.sendq) == (f"[::1]:{six.getsockname()[1]}", "[::]:*", 3)


def test_another_namespace_is_read_by_its_process(netns):
    """A child in a namespace of its own holds a listener: read through the child's pid, it is there;
    read here, it is not (a netlink socket reads the namespace it was made in)."""
    code = ("import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(5); "
            "print(s.getsockname()[1], flush=True); time.sleep(60)")
    child = subprocess.Popen(["unshare", "-n", sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = child.stdout.readline().strip()
        theirs = [s.local for s in tcpdiag.Namespace(child.pid).dump()]
        ours = [s.local for s in tcpdiag.Namespace().dump()]
        assert theirs == [f"127.0.0.1:{port}"] and f"127.0.0.1:{port}" not in ours
    finally:
        child.kill()
        child.wait()
    with pytest.raises(OSError):
        tcpdiag.Namespace(child.pid)                     # gone: one clear error, never another namespace


def test_a_shorter_tcp_info_gives_what_it_has():
    full = bytearray(232)
    struct.pack_into("=I", full, 44, 120)                # last_data_sent
    struct.pack_into("=Q", full, 200, 77)                # bytes_sent (Linux 4.19)
    assert dict(tcpdiag.TcpInfo(bytes(full))) == {"lastsnd": 120, "bytes_sent": 77}
    assert dict(tcpdiag.TcpInfo(bytes(full[:104]))) == {"lastsnd": 120}


def test_the_owner_of_a_connection_s_other_end_on_this_host():
    """Who holds the client socket of a connection we accepted (the metrics endpoint's per-user cap);
    None for an end that is not on this host."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    try:
        assert tcpdiag.owner_uid(conn.getpeername(), conn.getsockname()) == os.geteuid()
        assert tcpdiag.owner_uid(("127.0.0.1", 1), conn.getsockname()) is None
        assert tcpdiag.owner_uid(("no address", 1), ("127.0.0.1", 2)) is None
    finally:
        for s in (conn, cli, srv):
            s.close()


def test_run_in_runs_here_in_our_own_namespace_and_on_a_thread_in_another():
    """setns(2) is needed only for another namespace: in ours (a proxy on the host) no thread is made,
    and a gone pid is an OSError."""
    import threading
    from proxytune.core import netns as ns
    here = threading.get_ident()
    assert ns.run_in(os.getpid(), threading.get_ident) == here
    assert ns.run_in(None, threading.get_ident) == here
    other = subprocess.Popen(["unshare", "-n", "sleep", "30"])
    try:
        assert wait_for(lambda: os.readlink(f"/proc/{other.pid}/ns/net") != os.readlink("/proc/self/ns/net"), 10)
        assert ns.run_in(other.pid, threading.get_ident) != here
        assert ns.run_in(other.pid, lambda: sorted(n for _, n in socket.if_nameindex())) == ["lo"]
    finally:
        other.kill()
        other.wait()
    with pytest.raises(OSError):
        ns.run_in(other.pid, threading.get_ident)

"""connsample's fine fd peaks on this test's own process: a burst of fds
opened and closed between two ticks is seen, the non-socket fds are taken
off the socket estimate, and a kernel without the open-fd count in
st_size of /proc/PID/fd (before 6.2) is reported unavailable, not faked."""

import os
import socket

import pytest

from conftest import wait_for
from proxytune.core import tcpdiag
from proxytune.probes import connsample

HAS_COUNT = os.stat("/proc/self/fd").st_size > 0


@pytest.mark.skipif(not HAS_COUNT, reason="st_size of /proc/PID/fd is 0 here (Linux before 6.2)")
@pytest.mark.host  # the sampler runs ss (the tier: tests/tiers.py)
def test_a_burst_of_sockets_between_ticks_is_in_the_fine_peak():
    s = connsample.Sampler([os.getpid()])
    s.sample()                                   # a tick before the burst: its non-socket fds
    base = os.stat("/proc/self/fd").st_size
    burst = [socket.socket() for _ in range(200)]
    reads = s.fine.reads                 # two whole reads of the fine thread during the burst, none of a tick
    assert wait_for(lambda: s.fine.reads >= reads + 2, 30, every=0.01), "the fine thread never read"
    for b in burst:
        b.close()
    s.sample()                                   # a tick after: the burst is gone
    out = s.summary()
    mine = out["pids"][str(os.getpid())]
    assert out["fine"]["available"] and out["fine"]["reads"] > 0
    assert mine["sockets_peak"] < 200 <= mine["fds_peak_fine"] - base + 5
    # listing its own /proc/self/fd at a tick holds 2 more fds (the directory and listdir's dup of it),
    # which the fine reads do not see: on itself the estimate is low by those, never high
    assert 198 <= mine["sockets_peak_fine"] <= mine["fds_peak_fine"]


@pytest.mark.host  # the sampler runs ss (the tier: tests/tiers.py)
def test_no_open_fd_count_is_reported_unavailable(monkeypatch):
    monkeypatch.setattr(connsample.FdPeaks, "count", staticmethod(lambda pid: 0))
    s = connsample.Sampler([os.getpid()])
    s.sample()
    out = s.summary()
    assert out["fine"] == {"available": False, "reason": out["fine"]["reason"]} and "6.2" in out["fine"]["reason"]
    assert "sockets_peak_fine" not in out["pids"][str(os.getpid())]


def test_ephemeral_ports_are_counted_per_destination_and_never_above_the_range():
    """Two destinations of 6 ports each in a 6-port range: 12 sockets, yet no connect has failed; the
    count that can run out is the busiest destination's, 6 of 6. Listeners and ports outside the
    range are not ephemeral."""
    rows = [("TIME-WAIT" if p % 2 else "ESTAB", 0, 0, str(p), None, f"127.0.0.1>127.0.0.1:{dst}")
            for dst in (8080, 9090) for p in range(40000, 40006)]
    rows += [("LISTEN", 0, 128, "40003", 7, "0.0.0.0>0.0.0.0:*"), ("ESTAB", 0, 0, "22", None, "127.0.0.1>x:1")]
    n, flow = connsample.busiest_destination(rows, {"40003"}, (40000, 40005))
    assert n == 5 and flow in ("127.0.0.1>127.0.0.1:8080", "127.0.0.1>127.0.0.1:9090")
    assert connsample.busiest_destination(rows, set(), (40000, 40005))[0] == 6
    assert connsample.busiest_destination([], set(), (40000, 40005)) == (0, None)
    # a socket listed without a local port (ss's "*") is no ephemeral port: the doctor crashed on
    # int("*") beside nginx and Traffic Server under load (CI of h-watch b4ee4ee)
    unbound = [("SYN-SENT", 0, 0, "*", 9, "0.0.0.0>127.0.0.1:8080"), ("UNCONN", 0, 0, "*", 10, "0.0.0.0>0.0.0.0:*")]
    assert connsample.busiest_destination(rows + unbound, set(), (40000, 40005))[0] == 6


def _overflow(port: int, n: int = 20) -> list:
    """n connects to a listener that never accepts: those beyond its backlog are dropped by the kernel."""
    out = []
    for _ in range(n):
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        out.append(c)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a network namespace of its own)")
def test_each_listeners_own_drop_count_names_the_one_that_overflowed():
    """In a namespace of its own (TcpExt is then this test's alone): this process's listener and a child
    process's, neither accepting. Bursts to the child's overflow it only: the namespace's ListenOverflows
    grow, this process's listener counts no drop, the child's is named with its pid. Then the reverse."""
    import generic_cells as g
    with g.netns(), socket.socket() as own, g.StuckListener(2) as child:
        own.bind(("127.0.0.1", 0))
        own.listen(2)
        port = str(own.getsockname()[1])
        s = connsample.Sampler([os.getpid()])
        s.sample()
        held = _overflow(child.port)
        assert wait_for(lambda: (connsample.listener_drops(tcpdiag.Namespace()) or {}) and any(
            r["drops"] for r in connsample.listener_drops(tcpdiag.Namespace()).values()), 20), "the child's listener never dropped"
        s.sample()
        s.window_end()
        out = s.summary()
        assert out["listen_drops"]["available"] and out["ports"][port]["drops"] == 0
        other = out["listen_drops"]["others"][0]
        assert other["local"] == f"127.0.0.1:{child.port}" and other["drops"] > 0
        assert other["process"]["pid"] == child.proc.pid
        s = connsample.Sampler([os.getpid()])
        s.sample()
        held += _overflow(int(port))
        assert wait_for(lambda: connsample.listener_drops(tcpdiag.Namespace())[next(
            i for i, r in connsample.listener_drops(tcpdiag.Namespace()).items() if r["local"].endswith(f":{port}"))]["drops"], 20)
        s.window_end()
        assert s.summary()["ports"][port]["drops"] > 0
        for c in held:
            c.close()


@pytest.mark.host  # reads this process's sockets through sock_diag (the tier: tests/tiers.py)
def test_a_standing_window_s_last_tick_counts_the_connections_as_the_end_of_window_read_does():
    """The watcher's windows take the established connections from their last tick (no other walk of
    the kernel's hash): the same counts sockets.connections gives, and no TIME-WAIT dump at the end."""
    from proxytune.core import sockets
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen(8)
        port = lst.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        accepted = [lst.accept()[0] for _ in clients]
        try:
            s = connsample.Sampler([os.getpid()], "32768 60999", standing=True)
            s.sample()
            assert s.established == sockets.connections({str(port)}, [os.getpid()]) == {"clients": 3, "total": 6}
            assert s.summary()["ephemeral"]["at_end_with_time_wait"] is None
        finally:
            for c in clients + accepted:
                c.close()

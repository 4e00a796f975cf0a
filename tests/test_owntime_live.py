"""Each proxy's own clocks on the real proxy (issue 28): a proxy in front of
an origin whose delay the test sets, under load, read by its module's
timing() for a window; the origin's wait it reports must be the delay
(within 25 %), its own total at least that, and where it queues, the queue
must show with the directive that causes it. The doctor around it (the
kernel's side of the budget, the rules) is judged by the latency matrix."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import latency_cells as lc
import matrix
from conftest import IS_ROOT
from test_doctor import stop
from test_matrix_owncap import _fds, _netns  # noqa: F401  (module fixtures: a namespace of its own, fds)

pytestmark = pytest.mark.skipif(not (IS_ROOT and shutil.which("wrk")), reason="needs root and wrk")
# The latency matrix's lean part plays each proxy's own clock through the doctor in CI, and Varnish's and Traffic
# Server's queues are read here (their matrix cells fail: docs/DIAGNOSIS.md); the rest runs with the full matrix.
IN_CI = ("test_varnish_queue_for_a_worker", "test_trafficserver_queue_per_origin")
full_only = pytest.mark.skipif(not os.environ.get("PROXYTUNE_LATENCY_FULL"),
                               reason="the lean latency matrix covers it in CI (PROXYTUNE_LATENCY_FULL=1 runs it)")
WINDOW = 2.0


def server(proxy: str, origin: int, **kw):
    from proxytune.microbench import proxyservers, servers
    if proxy == "haproxy":
        return proxyservers.HAProxy(origin, cache_mb=0, **kw)
    if proxy == "varnish":
        return proxyservers.Varnish(origin, **kw)
    if proxy == "squid":
        return servers.Squid("rock", cache_mb=64, accel_to=origin, logformat=lc.SQUID_TIMED, **kw)
    if proxy == "trafficserver":
        return proxyservers.TrafficServer(origin, cache_mb=64, remap_to=origin, log_format=lc.TS_TIMED, **kw)
    return servers.Nginx(body=f"proxy_pass http://127.0.0.1:{origin};", timed_log=True, **kw)


def load(port: int, conns: int, tmp: Path, pause_ms: int = 0) -> subprocess.Popen:
    """wrk on fresh paths (nothing cached, no two requests coalesced), paced by pause_ms when asked."""
    script = tmp / "load.lua"
    script.write_text('request = function()\n  return wrk.format("GET", "/t/" .. math.random(1000000000))\nend\n'
                      + (f"delay = function()\n  return {pause_ms}\nend\n" if pause_ms else ""))
    return matrix.wrk(port, conns, script)


def read_clocks(pid: int) -> tuple[dict, dict]:
    from proxytune import proxies as kinds
    watched = kinds.identify(pid)
    assert watched is not None
    with watched.timing() as clock:
        time.sleep(WINDOW)
    p = {**watched.describe(), "timing": clock.result()}
    return p, watched.spec.time_parts(p)


def settle(proxy: str) -> float:
    """Load before the window: Traffic Server's clocks are the transactions that ended one flush interval
    (max_secs_per_buffer + 1 s) before it (proxies/trafficserver.py flush_lag), so it needs that much traffic
    behind it; the others, the connections and queues to settle."""
    if proxy == "trafficserver":
        from proxytune.proxies import trafficserver
        return 1.5 + trafficserver.flush_lag({})
    return 1.5


def run(proxy: str, delay: float, conns: int, tmp: Path, pause_ms: int = 0, **kw) -> tuple[dict, dict]:
    origin, port = matrix.start_slow_origin(delay)
    try:
        with server(proxy, port, **kw) as srv:
            wrk = load(srv.port, conns, tmp, pause_ms)
            try:
                time.sleep(settle(proxy))
                p, got = read_clocks(srv.pid)
            finally:
                stop(wrk)
            print(proxy, json.dumps(got, default=str)[:3000])
            conf = getattr(srv, "conf", None)
            return p, {**got, "origin_port": port, "conf": conf, "conf_text": conf.read_text() if conf else ""}
    finally:
        stop(origin)


def near(ms, want: float) -> bool:
    return ms is not None and abs(ms - want) <= 0.25 * want


@full_only
@pytest.mark.parametrize("proxy", ["haproxy", "varnish", "squid", "trafficserver", "nginx"])
def test_own_clock_measures_the_origins_delay(proxy, tmp_path):
    if not Path(matrix.BINARY[proxy]).exists():
        pytest.skip(f"{matrix.BINARY[proxy]} is not installed")
    p, got = run(proxy, 0.2, 8, tmp_path)
    fb = got["parts"]["origin_first_byte"]
    assert fb["measurable"], fb
    assert near(fb["ms"], 200), fb
    addr = f"127.0.0.1:{got['origin_port']}"
    assert addr in fb["by_origin"], fb["by_origin"]
    assert got["proxy_total"]["measurable"] and got["proxy_total"]["ms"] >= 0.9 * fb["ms"], got["proxy_total"]
    assert got["requests"]["n"], got["requests"]
    if proxy == "nginx":
        assert not got["parts"]["proxy_queue"]["measurable"]
    assert addr in type_of(proxy).origins(p)                    # named from the config too


def type_of(proxy: str):
    from proxytune import proxies as kinds
    return kinds.by_kind(proxy)


@full_only
def test_haproxy_queue_behind_server_maxconn(tmp_path):
    """server maxconn 4, 32 clients, 50 ms origin: 28 wait; about (32 - 4) / 80 per second = 350 ms."""
    p, got = run("haproxy", 0.05, 32, tmp_path, server_maxconn=4)
    q = got["parts"]["proxy_queue"]
    assert q["measurable"] and q["ms"] > 150, q
    assert q["cause"]["limit"] == 4 and "maxconn 4" in q["cause"]["directive"], q["cause"]
    assert q["cause"]["where"] == f"{got['conf']}:{_line(got['conf_text'], 'server o')}"
    assert q["check"]["little_ms"] > 150, q["check"]
    assert near(got["parts"]["origin_first_byte"]["ms"], 50)


def test_varnish_queue_for_a_worker(tmp_path):
    """10 workers in one pool; 16 clients paced at 100 ms (beyond timeout_linger, so a worker is freed after
    each answer) against a 100 ms origin: sessions wait in the pool's queue, below thread_queue_limit."""
    p, got = run("varnish", 0.1, 16, tmp_path, pause_ms=100,
                 params={"thread_pool_min": 10, "thread_pool_max": 10, "thread_pools": 1})
    q = got["parts"]["proxy_queue"]
    assert q["measurable"] and q["cause"]["limit"] == 10, q
    assert q["cause"]["queue_max"] > 0 and q["ms"] > 50, q


def test_trafficserver_queue_per_origin(tmp_path):
    """At most 4 connections to the origin (per_server.connection.max), the rest queued (queue_size -1).

    ATS 9.2's queue is no FIFO (proxy/http/HttpSM.cc do_http_server_open): a transaction over the cap is
    rescheduled every queue_delay (100 ms) and tries again, while a newcomer that finds an idle pooled session
    takes it at once. So how many of the window's transactions waited, and the mean over all of them, follow
    the races (12 of 153 and 43 ms on one CI look, over 50 ms on others); what the mechanism fixes is that
    every wait the clock shows is at least one reschedule: the waiters' mean is >= queue_delay."""
    rec = {"proxy.config.http.per_server.connection.max": ("INT", 4),
           "proxy.config.http.per_server.connection.queue_size": ("INT", -1)}
    p, got = run("trafficserver", 0.05, 24, tmp_path, records=rec)
    q = got["parts"]["proxy_queue"]
    assert q["measurable"] and q["cause"]["waited"], q
    assert q["ms"] * q["samples"] / q["cause"]["waited"] >= 0.9 * 100, q
    assert q["cause"]["queue_mean"] > 0, q["cause"]
    assert q["cause"]["limit"] == 4 and "per_server.connection.max" in q["cause"]["directive"], q["cause"]


def _line(conf_text: str, text: str) -> int:
    return next(n for n, line in enumerate(conf_text.splitlines(), 1) if text in line)

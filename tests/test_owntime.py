"""Each proxy's own clocks (issue 28), pure: how a module turns what its
proxy said in the window (stats, log lines, shared-memory log records) into
parts of a request's time. No proxy runs here: the live side is in
tests/test_owntime_live.py and the latency matrix."""

import random
import time

import pytest

from proxytune import proxies as kinds
from proxytune.proxies import base, haproxy, nginx, squid, timing, trafficserver, varnish


def lines_of(text: str, file: str = "/etc/x.conf") -> list[base.Line]:
    return [base.Line(file, n, t) for n, t in enumerate(text.splitlines(), 1)]


# ---------------------------------------------------------------- haproxy: the sliding mean, inverted

def haproxy_counter(values, sum0=0, n0=0):
    """HAProxy 2.6's own arithmetic for one backend's time (src/stream.c stream_update_time_stats,
    include/haproxy/freq_ctr.h swrate_add_dynamic, src/stats.c swrate_avg over min(cum_req, 1024))."""
    s, n = sum0, n0
    for v in values:
        n += 1
        window = 1024 if n > 1024 else 0
        s = s - ((s + window - 1) // window if window else 0) + v
    shown = (s + min(n, 1024) - 1) // min(n, 1024) if n else 0
    return s, n, shown


@pytest.mark.parametrize("before,during,value", [
    (0, 300, 200), (200, 300, 200), (300, 600, 7), (800, 600, 300),      # below 1024, and crossing it
    (3000, 300, 300), (3000, 2000, 40), (5000, 150, 1000),              # past it: the decaying sum
])
def test_window_mean_recovers_the_window_from_two_readings(before, during, value):
    rng = random.Random(before + during)
    old = [rng.randint(0, 50) for _ in range(before)]                  # a different load before the window
    s0, n0, a0 = haproxy_counter(old)
    new = [max(0, value + rng.randint(-value // 10, value // 10)) for _ in range(during)]
    _, n1, a1 = haproxy_counter(new, s0, n0)
    mean, half = haproxy.window_mean(a0, a1, n0, n1)
    truth = sum(new) / len(new)
    assert abs(mean - truth) <= half + 0.02 * truth + 0.5, (mean, truth, half)


def test_window_mean_needs_requests_in_the_window():
    assert haproxy.window_mean(5, 5, 100, 100) is None


SHOW_STAT = ("# pxname,svname,qcur,qmax,scur,smax,slim,stot,req_tot,qtime,ctime,rtime,ttime,type,addr\n"
             "fe,FRONTEND,,,3,5,4096,{fe},{fe},,,,,0,\n"
             "app,s1,{q1},9,4,4,4,{n},{n},{qt},{ct},{rt},{tt},2,127.0.0.1:8080\n"
             "app,BACKEND,{qb},9,4,4,410,{n},{n},{qt},{ct},{rt},{tt},1,\n")
HAP_CFG = """global
    stats socket /run/h.sock
defaults
    mode http
    default-server maxconn 16
backend app
    server s1 127.0.0.1:8080 maxconn 4 check
    server s2 10.0.0.2:80
"""


def hap_rows(text: str) -> list[dict]:
    from proxytune.core.numbers import uint
    lines = text.splitlines()
    head = lines[0][2:].split(",")
    out = []
    for line in lines[1:]:
        rec = dict(zip(head, line.split(",")))
        row = {"px": rec["pxname"], "sv": rec["svname"],
               **{k: uint(rec[k]) for k in haproxy.KEEP if uint(rec.get(k) or "") is not None}}
        if rec.get("addr"):
            row["addr"] = rec["addr"]
        out.append(row)
    return out


def test_haproxy_parts_from_two_show_stat_readings_and_the_server_line():
    cfg = lines_of(HAP_CFG, "/etc/haproxy/haproxy.cfg")
    before = hap_rows(SHOW_STAT.format(fe=100, n=100, q1=0, qb=0, qt=0, ct=0, rt=10, tt=20))
    after = hap_rows(SHOW_STAT.format(fe=300, n=300, q1=7, qb=0, qt=267, ct=1, rt=54, tt=400))
    t = {"available": True, "before": before, "after": after, "servers": haproxy.server_lines(cfg),
         "queue_samples": [{"app": 0, "app/s1": 6}, {"app": 0, "app/s1": 8}], "window_s": 2.0}
    got = haproxy.clock_parts({"timing": t})
    p = got["parts"]
    assert got["requests"]["n"] == 200 and "frontend" in got["requests"]["source"]
    # 100 requests at 10 ms, then 200 more: the window's mean is (54 x 300 - 10 x 100) / 200 = 76 (less rounding)
    assert p["origin_first_byte"]["ms"] == pytest.approx(76, abs=2)
    assert p["origin_first_byte"]["requests"] == 200
    assert p["origin_first_byte"]["by_origin"]["127.0.0.1:8080"]["where"] == "/etc/haproxy/haproxy.cfg:7"
    q = p["proxy_queue"]
    assert q["ms"] == pytest.approx(400, abs=2)
    assert q["cause"]["directive"] == "server s1 127.0.0.1:8080 maxconn 4 check"
    assert q["cause"]["where"] == "/etc/haproxy/haproxy.cfg:7" and q["cause"]["limit"] == 4
    assert q["cause"]["queue_max"] == 8 and q["check"]["little_ms"] == pytest.approx(70)
    assert got["proxy_total"]["ms"] == pytest.approx(q["ms"] + p["origin_connect"]["ms"] + 76, abs=3)
    assert "ttime" in got["proxy_total"]["mechanism"]          # said why ttime is not the total


def test_haproxy_server_lines_take_default_server_maxconn():
    s = haproxy.server_lines(lines_of(HAP_CFG))
    assert [(x["server"], x["maxconn"]) for x in s] == [("s1", 4), ("s2", 16)]
    assert haproxy.clock_origins(lines_of(HAP_CFG)) == {
        "127.0.0.1:8080": {"name": "backend app, server s1", "where": "/etc/x.conf:7"},
        "10.0.0.2:80": {"name": "backend app, server s2", "where": "/etc/x.conf:8"}}


def test_haproxy_without_stats_socket_says_why():
    got = kinds.by_kind("haproxy").time_parts({"timing": {"available": False, "reason": "no `stats socket`"}})
    assert all(not p["measurable"] and "stats socket" in p["why"] for p in got["parts"].values())


# ---------------------------------------------------------------- log formats: linear, exact

def test_template_regex_is_possessive_on_hostile_lines():
    fmt = timing.template_regex(squid.format_tokens(squid.BUILTIN["squid"]))
    for hostile in ("1.1 " + " " * 8000 + "x", "/" * 8000, "1." + "1 " * 4000):
        t0 = time.monotonic()
        timing.parse_line(fmt, hostile)
        assert time.monotonic() - t0 < 0.05
    assert timing.template_regex([("field", "a"), ("field", "b")]) is None       # no way to split them


def test_squid_default_and_timed_formats():
    fmt = squid.BUILTIN["squid"] + " %<pt %<tt"
    text = ("1700000000.123    305 127.0.0.1 TCP_MISS/200 312 GET http://127.0.0.1:8080/x - HIER_DIRECT/127.0.0.1 "
            "text/plain 301 303\n"
            "1700000000.200      1 127.0.0.1 TCP_MEM_HIT/200 312 GET http://127.0.0.1:8080/y - HIER_NONE/- "
            "text/plain - -\n"
            "garbage line\n")
    got = squid.read_lines(text, fmt)
    assert got["requests"] == 2 and got["unread"] == 1
    assert got["origins"]["127.0.0.1:8080"]["first_byte"]["sum_ms"] == 301
    assert got["origins"]["127.0.0.1:8080"]["connect"]["sum_ms"] == 2
    plain = squid.read_lines(text, squid.BUILTIN["squid"])
    p = squid.clock_parts({"timing": {"available": True, "lines": plain, "log": {"path": "/l", "format": "squid"}}})
    assert p["proxy_total"]["ms"] == 153 and p["requests"]["n"] == 2
    assert not p["parts"]["origin_first_byte"]["measurable"] and "%<pt" in p["parts"]["origin_first_byte"]["why"]
    assert "no queue" in p["parts"]["proxy_queue"]["why"]


def test_squid_config_logs_and_peers():
    cfg = lines_of("http_port 3128 accel\nlogformat timed %ts %tr %<a %<pt\naccess_log stdio:/var/log/s.log timed\n"
                   "access_log syslog:daemon.info squid\ncache_peer 127.0.0.1 parent 8080 0 originserver name=app\n")
    logs = squid.logs(cfg)
    assert [(x["path"], x["format"], x["format_where"]) for x in logs] == [("/var/log/s.log", "timed", "/etc/x.conf:2")]
    assert squid.clock_origins(cfg) == {"127.0.0.1:8080": {"name": "cache_peer app", "where": "/etc/x.conf:5"}}
    assert squid.logs(lines_of("http_port 3128\n"))[0]["path"] == squid.DEFAULT_LOG


NGINX_CFG = """http {
  log_format timed '$remote_addr [$time_local] "$request" $status '
                   'rt=$request_time uct=$upstream_connect_time uht=$upstream_header_time ua=$upstream_addr';
  access_log /var/log/n.log timed;
  upstream app { server 127.0.0.1:8080; }
  server { listen 80; location / { proxy_pass http://app; } }
}
"""


def test_nginx_log_format_over_lines_and_retries():
    formats, logs = nginx.formats_and_logs(lines_of(NGINX_CFG))
    assert logs[0]["format"] == "timed" and formats["timed"]["where"] == "/etc/x.conf:2"
    text = ('10.0.0.1 [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 rt=0.302 uct=0.000 uht=0.301 '
            'ua=127.0.0.1:8080\n'
            '10.0.0.1 [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 rt=0.210 uct=0.000, 0.001 '
            'uht=0.100, 0.101 ua=10.9.9.9:80, 127.0.0.1:8080\n'
            '10.0.0.1 [10/Oct/2000:13:55:36 -0700] "GET /s HTTP/1.1" 200 rt=0.000 uct=- uht=- ua=-\n')
    got = nginx.read_lines(text, formats["timed"]["text"])
    assert got["lines"] == 3 and got["first_byte"]["n"] == 2
    assert got["origins"]["127.0.0.1:8080"]["sum_ms"] == pytest.approx(301 + 200)
    p = nginx.clock_parts({"timing": {"available": True, "lines": got, "log": logs[0],
                                     "upstreams": nginx.upstream_lines(lines_of(NGINX_CFG))}})
    fb = p["parts"]["origin_first_byte"]
    assert fb["ms"] == pytest.approx(250.5) and fb["by_origin"]["127.0.0.1:8080"]["name"] == "upstream app"
    assert not p["parts"]["proxy_queue"]["measurable"] and "no request queue" in p["parts"]["proxy_queue"]["why"]


def test_nginx_with_no_timed_log_says_which_format():
    class P:
        lines, argv = lines_of("http { access_log /var/log/n.log; }\n"), ["nginx"]
    assert "none of $request_time" in nginx.choose_log(P)["why"]
    P.lines = lines_of("http { access_log off; }\n")
    assert "not a file" in nginx.choose_log(P)["why"]


# ---------------------------------------------------------------- varnish: the shared-memory log

VSL = """     32770 BackendOpen    b 26 boot.origin 127.0.0.1 8080 127.0.0.1 51000 connect
     32770 Timestamp      b Connected: 1700000000.000300 0.000300 0.000200
     32770 Timestamp      b Bereq: 1700000000.000400 0.000400 0.000100
     32770 Timestamp      b Beresp: 1700000000.250400 0.250400 0.250000
     32769 Timestamp      c Resp: 1700000000.251000 0.251000 0.000100
     32772 Timestamp      c Waitinglist: 1700000000.301000 0.050000 0.050000
     32772 Timestamp      c Resp: 1700000000.302000 0.052000 0.001000
     bogus line Timestamp c Resp: 1 2 3
"""


def test_varnish_log_and_queue():
    log = varnish.read_log(VSL)
    assert log["requests"] == 2 and log["first_byte"]["sum_ms"] == pytest.approx(250)
    cfg = lines_of('vcl 4.1;\nbackend origin {\n  .host = "127.0.0.1";\n  .port = "8080";\n}\n', "/etc/v.vcl")
    t = {"available": True, "log": log, "window_s": 2.0, "backends": varnish.backend_lines(cfg),
         "queue_start": {"MAIN.thread_queue_len": 0, "MAIN.sess_queued": 10},
         "queue_samples": [4, 4], "queue_end": {"MAIN.thread_queue_len": 4, "MAIN.sess_queued": 30}}
    p = {"timing": t, "directives": {"thread_pool_max": {"value": "10", "where": "varnishd command line (-p)"},
                                     "thread_pools": {"value": "1"}, "thread_queue_limit": {"value": "20"}}}
    got = varnish.clock_parts(p)
    fb = got["parts"]["origin_first_byte"]
    assert fb["ms"] == pytest.approx(250) and fb["by_origin"]["127.0.0.1:8080"]["where"] == "/etc/v.vcl:2"
    q = got["parts"]["proxy_queue"]
    # mean length 3 over 2 s and 2 requests: 3 s of waiting, 3000 ms each; the waiting list 25 ms each
    assert q["ms"] == pytest.approx(3000 + 25) and q["cause"]["limit"] == 10
    assert q["cause"]["counted_in_window"]["sess_queued"] == 20
    assert varnish.clock_origins(cfg, ["10.1.1.1:80"]) == {
        "127.0.0.1:8080": {"name": "backend origin", "where": "/etc/v.vcl:2"},
        "10.1.1.1:80": {"name": "varnishd -b", "where": "varnishd command line (-b)"}}


# ---------------------------------------------------------------- traffic server: milestones

TS_YAML = """logging:
  formats:
    - name: timed
      format: '%<cqtq> %<ttms> %<crc>/%<pssc> %<cquc> %<phr>/%<shn> %<{TS_MILESTONE_SERVER_FIRST_READ-\
TS_MILESTONE_SERVER_BEGIN_WRITE}msdms> %<{SERVER_CONNECT-SERVER_FIRST_CONNECT}msdms>'
    - name: long
      format: |-
          a=%<ttms>
          b=%<chi>
  logs:
    - filename: access
      format: timed
      mode: ascii
"""


def test_trafficserver_log_milestones_skip_unreached():
    formats, logs = trafficserver.logging_yaml(TS_YAML)
    assert formats["long"] == "a=%<ttms> b=%<chi>" and logs == [{"filename": "access", "format": "timed",
                                                                  "mode": "ascii"}]
    text = ("1700000000.123 305 TCP_MISS/200 http://127.0.0.1:8080/x DIRECT/127.0.0.1 300 100\n"
            "1700000000.124 1 TCP_HIT/200 http://127.0.0.1:8080/y NONE/- -1 -1\n")
    got = trafficserver.read_lines(text, formats["timed"])
    assert got["parts"]["origin_first_byte"] == {"n": 1, "sum_ms": 300, "p50": 300, "p99": 300}
    cfg = lines_of("CONFIG proxy.config.http.per_server.connection.max INT 4\n", "/etc/ts/records.config")
    p = trafficserver.clock_parts({"timing": {"available": True, "lines": got, "log": {"path": "/l", "format": "timed"},
                                             "records": trafficserver.records(cfg)}})
    assert p["parts"]["origin_first_byte"]["ms"] == 300 and p["parts"]["origin_first_byte"]["requests"] == 1
    q = p["parts"]["proxy_queue"]
    assert q["ms"] == 100 and q["cause"]["where"] == "/etc/ts/records.config:1" and q["cause"]["limit"] == 4
    assert p["proxy_total"]["ms"] == 153


def test_trafficserver_stats_need_a_sync_and_no_cap_means_no_queue():
    s0 = {"completed_requests": 10, "milestone.server_first_read": 1000, "milestone.server_begin_write": 500,
          "milestone.sm_finish": 2000, "milestone.server_connect": 0, "milestone.server_first_connect": 0,
          "milestone.server_connect_end": 0}
    t = {"available": True, "stats_start": s0, "stats_end": dict(s0), "records": {}}
    p = trafficserver.clock_parts({"timing": t})
    assert "no sync" in p["parts"]["origin_first_byte"]["why"]
    assert "no queue" in p["parts"]["proxy_queue"]["why"]
    t["stats_end"] = {**s0, "completed_requests": 20, "milestone.server_first_read": 4000,
                      "milestone.server_begin_write": 1000}
    assert trafficserver.clock_parts({"timing": t})["parts"]["origin_first_byte"]["ms"] == 250


# ---------------------------------------------------------------- every kind: the interface

@pytest.mark.parametrize("kind", kinds.KINDS, ids=lambda k: k.kind)
def test_every_kind_answers_with_the_budget_shape(kind):
    got = kind.time_parts({"timing": {"available": False, "reason": "not read"}})
    assert set(got) == {"parts", "proxy_total", "requests"}
    assert set(got["parts"]) == {"proxy_queue", "origin_connect", "origin_first_byte"}
    for part in [*got["parts"].values(), got["proxy_total"]]:
        assert part["measurable"] is False and part["ms"] is None and part["why"]
    assert kind.origins({"timing": {"origins": {"1.2.3.4:80": {"name": "x", "where": "f:1"}}}}) == {
        "1.2.3.4:80": {"name": "x", "where": "f:1"}}


def test_addresses_are_normalised_and_never_resolved():
    assert timing.address("::1", "80") == "[::1]:80" and timing.split_address("[::1]:80") == "[::1]:80"
    assert timing.address("origin.example", 80) is None and timing.split_address("127.0.0.1:99999") is None
    assert timing.decimal("0.300") == 0.3 and timing.decimal("١٠") is None and timing.decimal("1e9") is None


def test_trafficserver_reads_the_transactions_its_log_buffers_held_back():
    """ATS writes a line up to max_secs_per_buffer after its transaction: the transactions that ENDED in an
    interval as long as the window, one flush interval earlier, are all written (a long wait included);
    a cut first line is dropped."""
    fmt = "%<cqtq> %<ttms> %<shi>"
    tail = ("7 300 127.0.0.1\n1000.000 300 127.0.0.1\n1002.000 2900 127.0.0.1\n1004.500 310 127.0.0.1\n"
            "1006.000 320 127.0.0.1\n")
    assert trafficserver.recent(tail, fmt, 1004.0, 1006.0).splitlines() == ["1002.000 2900 127.0.0.1",
                                                                                 "1004.500 310 127.0.0.1"]
    assert trafficserver.recent(tail, "%<ttms> %<shi>", 0, 9e9) == ""       # no timestamp: nothing to pick
    rec = trafficserver.records(lines_of("CONFIG proxy.config.log.max_secs_per_buffer INT 2\n"))
    assert trafficserver.flush_lag(rec) == 3 and trafficserver.flush_lag({}) == 6


def test_squid_names_a_cache_peer_by_its_configured_port():
    """To a cache_peer, %ru is what the client asked (an accelerator's own port): the peer's port is the
    cache_peer line's."""
    text = ("1700000000.123    201 127.0.0.1 TCP_MISS/200 312 GET http://127.0.0.1:3128/x - FIRSTUP_PARENT/127.0.0.1 "
            "text/plain 200 201\n")
    lines = squid.read_lines(text, squid.BUILTIN["squid"] + " %<pt %<tt")
    assert list(lines["origins"]) == ["127.0.0.1"]
    cfg = lines_of("cache_peer 127.0.0.1 parent 8080 0 originserver name=app\n")
    t = {"available": True, "lines": lines, "log": {"path": "/l", "format": "x"}, "peers": squid.peers(cfg)}
    fb = squid.clock_parts({"timing": t})["parts"]["origin_first_byte"]
    assert list(fb["by_origin"]) == ["127.0.0.1:8080"] and fb["by_origin"]["127.0.0.1:8080"]["where"] == "/etc/x.conf:1"


def test_a_window_s_log_cursor_reads_only_that_window_s_lines_and_the_stats_count_grows(tmp_path):
    """The own clocks read a log by a window cursor: in a standing session (the watcher), each window
    reads the lines written since the last, not all since the session's first (which made its budget
    an average since then). The stats' error-log count keeps reading from its first call."""
    import subprocess
    from proxytune.probes.proxies import Running
    log = tmp_path / "access.log"
    log.write_text("old\n")
    proc = subprocess.Popen(["sleep", "60"], cwd=tmp_path)
    try:
        target = Running(proc.pid, "/usr/sbin/squid", ["squid"])
        assert target.appended(str(log), window=True) == "" and target.appended(str(log)) == ""
        with log.open("a") as fh:
            fh.write("one\n")
        assert target.appended(str(log), window=True) == "one\n"
        with log.open("a") as fh:
            fh.write("two\n")
        assert target.appended(str(log), window=True) == "two\n"
        assert target.appended(str(log), window=True) == ""
        assert target.appended(str(log)) == "one\ntwo\n"
        log.write_text("rotated\n")                                 # smaller: read from 0
        assert target.appended(str(log), window=True) == "rotated\n"
    finally:
        proc.kill()
        proc.wait()

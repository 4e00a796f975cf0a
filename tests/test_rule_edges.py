"""Issue 28's three precision misses, pinned at their rules' edges on
constructed and recorded evidence (no root, no proxy):

- a maxconn HAProxy 2.6 derives from its fd limit is its cap: computed as
  src/haproxy.c compute_ideal_maxconn does, or read back from its listener's
  backlog (src/listener.c listener_backlog), ranked first with the fix that
  moves maxconn and the fd limit together;
- cpu-hotspot is a finding only when the proxy's CPU is what its requests
  wait on (a thread near a full core, or every CPU it may use busy); else
  its top functions are headroom information;
- the namespace-wide listen counters are this proxy's only when its own
  listeners show them (their own drop count, sk_drops; else a queue seen);
  else a low note names the listener that overflowed.
"""

import copy
import json
from pathlib import Path

import pytest

from proxytune.probes import connsample, findings, owncap, proxies_findings
from proxytune.proxies import base, haproxy

EVIDENCE = Path(__file__).parent / "evidence"


def ranked(ev: dict) -> list[findings.Finding]:
    """The rules as doctor.diagnose ranks them."""
    return proxies_findings.cpu_bound(proxies_findings.refine(findings.evaluate(ev), ev), ev)


# ------------------------------------------------------------------ a derived HAProxy maxconn

def hap(cfg: str, nofile=(256, 256), threads: int = 2, listeners: int = 1, clients: int = 0, queued: int = 0,
        overflows: int = 0, backlog: int | None = None, somaxconn: int | None = 4096, argv=("haproxy",)) -> dict:
    lines = [base.Line("/etc/haproxy/haproxy.cfg", n, t) for n, t in enumerate(cfg.splitlines(), 1)]
    d = base.directives(lines, ("maxconn", "ulimit-n", "fd-hard-limit", "nbthread"), section="global")
    d["frontends"] = haproxy.sections(lines)
    d["fd_users"] = haproxy.fd_users(lines, list(argv))
    port = "8080"
    return {"proxy": {"kind": "haproxy", "pid": 1, "config": "/etc/haproxy/haproxy.cfg", "directives": d,
                      "threads": threads, "nofile": list(nofile), "stats_before": {"available": False},
                      "stats_after": {"available": False}},
            "procs": {"1": {"pid": 1, "comm": "haproxy", "fds_open": clients + 12, "nofile_soft": nofile[0],
                            "nofile_hard": nofile[1], "fd_use": (clients + 12) / nofile[0]}},
            "listeners": [{"local": f"127.0.0.1:{port}", "queued": queued, "backlog": backlog or 100, "pids": [1]}
                          for _ in range(listeners)],
            "netstat": {"ListenOverflows": overflows, "ListenDrops": overflows},
            "kernel": {"sysctl": {} if somaxconn is None else {"net.core.somaxconn": somaxconn}},
            "pids": [1], "comm": "haproxy", "bpf": {}, "window_s": 3.0, "cache_dirs": [], "perf": {"available": False},
            "cpu_cores": 0.05,
            "conns": {"clients_peak": clients,
                      "ports": {port: {"clients_peak": clients, "queued_peak": queued, "queued_samples": 1,
                                       "backlog": backlog or 100}}}}


PLAIN = "global\n    daemon\ndefaults\n    mode http\nfrontend fe\n    bind 127.0.0.1:8080\n    default_backend be\n" \
        "backend be\n    server o 127.0.0.1:80\n"


@pytest.mark.parametrize("cfg, nofile, argv, expected", [
    (PLAIN, (256, 256), ("haproxy",), (256 - 10 - 1 - 3 * 2) // 2),                    # 119: the issue's shape
    (PLAIN, (128, 512), ("haproxy",), (512 - 10 - 1 - 3 * 2) // 2),                    # the hard limit counts
    (PLAIN.replace("daemon", "daemon\n    stats socket /s mode 600"), (256, 256), ("haproxy",),
     (256 - 10 - 1 - 1 - 10 - 6) // 2),                                                # + the CLI's listener, maxconn
    (PLAIN.replace("daemon", "daemon\n    stats socket /s\n    stats maxconn 30"), (256, 256), ("haproxy",),
     (256 - 10 - 1 - 1 - 30 - 6) // 2),
    (PLAIN.replace("127.0.0.1:80", "127.0.0.1:80 check"), (256, 256), ("haproxy",), (256 - 10 - 1 - 1 - 6) // 2),
    (PLAIN, (4096, 4096), ("haproxy", "-Ws", "-S", "/run/m.sock"), (4096 - 10 - 1 - 1 - 10 - 11 - 6) // 2),
    (PLAIN.replace("daemon", "master-worker"), (4096, 4096), ("haproxy",), (4096 - 10 - 1 - 1 - 10 - 6) // 2),
    (PLAIN.replace("daemon", "daemon\n    fd-hard-limit 1000"), (65536, 65536), ("haproxy",), (1000 - 17) // 2),
    (PLAIN.replace("daemon", "daemon\n    nbthread 1"), (256, 256), ("haproxy",), (256 - 10 - 1 - 3) // 2),
    (PLAIN, (200, 200), ("haproxy",), 100),                                            # DEFAULT_MAXCONN floor
])
def test_the_derived_maxconn_is_computed_as_haproxy_2_6_does(cfg, nofile, argv, expected):
    assert haproxy.computed_maxconn(hap(cfg, nofile, argv=argv))["maxconn"] == expected


def test_the_computation_agrees_with_what_haproxy_said_on_a_recorded_run():
    """fd-haproxy (tests/evidence/generic): 256 fds, 2 threads, one listener and a stats socket; haproxy's
    own `show info` said Maxconn 114."""
    doc = json.loads((EVIDENCE / "generic" / "fd-haproxy.json").read_text())
    ev = doc["data"]["evidence"]
    said = ev["proxy"]["stats_after"]["Maxconn"]
    assert said == 114 and haproxy.computed_maxconn(ev)["maxconn"] == said
    no_stats = copy.deepcopy(ev)
    for k in ("stats_before", "stats_after"):
        no_stats["proxy"][k] = {"available": False}
    no_stats["kernel"]["sysctl"]["net.core.somaxconn"] = 4096       # the listener's backlog is then read back
    g = haproxy.global_maxconn(no_stats)
    assert (g["limit"], g["estimate"]) == (114, False) and "backlog" in g["how"]["read"]


def test_the_listeners_backlog_is_the_derived_maxconn_only_where_nothing_else_sets_it():
    ev = hap(PLAIN, backlog=117)
    assert haproxy.backlog_maxconn(ev) == 117
    assert haproxy.backlog_maxconn(hap(PLAIN, backlog=117, somaxconn=None)) is None        # somaxconn unknown
    assert haproxy.backlog_maxconn(hap(PLAIN, backlog=4096)) is None                        # capped by it
    assert haproxy.backlog_maxconn(hap(PLAIN.replace(":8080", ":8080 backlog 64"), backlog=64)) is None
    assert haproxy.backlog_maxconn(hap(PLAIN.replace("mode http", "mode http\n    backlog 64"), backlog=64)) is None
    assert haproxy.backlog_maxconn(hap(PLAIN.replace("default_backend", "maxconn 64\n    default_backend"),
                                       backlog=64)) is None


@pytest.mark.parametrize("clients, first", [(119 - 2, "haproxy-maxconn"), (119 - 3, "accept-queue-overflow")])
def test_at_a_derived_maxconn_the_cap_is_first_and_both_limits_move_together(clients, first):
    """The issue's shape: no maxconn, 256 fds, idle keep-alive clients (about half the fds), the accept queue
    full. Within one session per thread of the cap it is the cap; one below that, the kernel's symptom."""
    ev = hap(PLAIN, clients=clients, queued=120, overflows=500, backlog=119)
    ev["conns"]["listen_drops"] = {"available": True, "others": []}
    ev["conns"]["ports"]["8080"]["drops"] = 500
    out = ranked(ev)
    assert out[0].id == first and out[0].severity == "high"
    if first == "haproxy-maxconn":
        assert "set maxconn and the fd limit together" in out[0].fix and "backlog 8192" not in out[0].fix
        assert out[0].evidence["limit"] == 119 and not out[0].evidence["limit_estimated"]
        assert "accept-queue-overflow" not in [f.id for f in out]          # its evidence now
        assert out[0].evidence["derived_maxconn"]["computed"]["maxconn"] == 119
        low = next(f for f in out if f.id == "low-nofile-limit")            # the fd limit is the same cap
        assert "set maxconn and the fd limit together" in low.fix and "maxconn not set" not in low.fix


def test_a_written_maxconn_keeps_its_own_fix():
    ev = hap(PLAIN.replace("daemon", "daemon\n    maxconn 200"), clients=200, queued=9)
    out = ranked(ev)
    assert out[0].id == "haproxy-maxconn" and "raise `maxconn 200`" in out[0].fix
    assert "derived_maxconn" not in out[0].evidence


# ------------------------------------------------------------------ cpu-hotspot: the loop, not the share

def cpu_ev(cores: float, busiest: float | None, cpus: int = 2, share: float = 0.3) -> dict:
    top = [{"function": "ngx_http_parse_request_line", "dso": "nginx", "where": "proxy", "samples": 300,
            "share": share}, {"function": "memcpy", "dso": "libc.so.6", "where": "shared library",
                              "samples": 100, "share": 0.1}]
    ev = {"pids": [1], "comm": "nginx", "window_s": 3.0, "bpf": {}, "procs": {}, "netstat": {}, "listeners": [],
          "cache_dirs": [], "cpu_cores": cores,
          "perf": {"available": True, "samples": 1000, "split": {"proxy": 0.5, "kernel": 0.5}, "top": top,
                   "own_top": top[:1]}}
    if busiest is not None:
        ev["threads"] = {"available": True, "cpus_allowed": cpus, "threads": 3,
                         "busiest": [{"pid": 2, "tid": 2, "comm": "nginx", "cores": busiest}]}
    return ev


@pytest.mark.parametrize("cores, busiest, cpus, fires", [
    (0.35, 0.2, 2, False),          # the issue: 2 workers at a few thousand requests/s
    (0.79, 0.79, 2, False),         # just below the loop's edge
    (0.8, 0.8, 2, True),            # a loop at 80 %: an event waits 4 event times
    (1.7, 0.45, 2, True),           # a pool: every CPU it may use is busy
    (1.5, 0.45, 2, False),
    (0.9, 0.9, 2, True),
    (0.9, None, 2, False),          # no per-thread CPU recorded: nothing says the loop is busy
])
def test_cpu_hotspot_needs_the_proxys_cpu_to_be_what_requests_wait_on(cores, busiest, cpus, fires):
    ids = [f.id for f in findings.evaluate(cpu_ev(cores, busiest, cpus))]
    assert ("cpu-hotspot" in ids) == fires


def test_a_busy_healthy_proxys_top_functions_are_headroom_information():
    ev = cpu_ev(0.35, 0.2)
    assert ranked(ev) == []
    row = findings.cpu_headroom(ev)
    assert row["used"] == 0.2 and row["limit"] == 1
    assert [t["function"] for t in row["top_functions"]] == ["ngx_http_parse_request_line", "memcpy"]
    assert "information, no finding" in row["where"]
    assert "of its own code, with the calls it makes: ngx_http_parse_request_line 30%" in row["where"]
    rows = owncap.headroom([], ev)
    assert rows[-1] is not None and rows[-1]["share"] == 0.2
    hot = cpu_ev(0.95, 0.95)
    assert "top_functions" not in findings.cpu_headroom(hot)          # they are the finding there


def test_a_saturated_loop_is_still_a_hotspot_or_cpu_bound():
    out = ranked(cpu_ev(0.95, 0.95, share=0.3))
    assert [f.id for f in out] == ["cpu-bound"]                         # no own function dominates
    out = ranked(cpu_ev(0.95, 0.95, share=0.6))
    assert [f.id for f in out] == ["cpu-hotspot"] and out[0].evidence["cpu_waited_on"]["met"] == "busiest thread"


# ------------------------------------------------------------------ the namespace's listen counters

def ns_ev(own_drops: int | None, overflows: int = 600, own_queue: int = 0, others: list | None = None,
          now_queued: int = 0, cookies: int = 0, synq_drops: int = 0) -> dict:
    port = {"queued_peak": own_queue, "queued_samples": int(own_queue > 0), "backlog": 4096, "clients_peak": 4}
    if own_drops is not None:
        port["drops"] = own_drops
    drops = {"available": own_drops is not None, "others": others or []}
    return {"pids": [1], "comm": "nginx", "window_s": 3.0, "bpf": {}, "procs": {}, "cache_dirs": [],
            "perf": {"available": False}, "cpu_cores": 0.05,
            "netstat": {"ListenOverflows": overflows, "ListenDrops": overflows + synq_drops,
                        "TCPReqQFullDoCookies": cookies, "TCPReqQFullDrop": synq_drops},
            "listeners": [{"local": "127.0.0.1:8080", "queued": now_queued, "backlog": 4096, "pids": [1]}],
            "conns": {"ports": {"8080": port}, "listen_drops": drops}}


STUCK = {"local": "127.0.0.1:9999", "queued_peak": 5, "full_samples": 12, "backlog": 4, "drops": 600,
         "process": {"pid": 77, "comm": "python3"}}


def by_id(ev: dict) -> dict:
    return {f.id: f for f in findings.evaluate(ev)}


def test_another_listeners_overflow_is_a_low_note_naming_it():
    """The issue: 0 queued of 4096 on the proxy's own listener, ListenOverflows from a listener next to it."""
    f = by_id(ns_ev(own_drops=0, others=[STUCK]))
    assert "accept-queue-overflow" not in f
    note = f["other-listener-overflow"]
    assert note.severity == "low" and "127.0.0.1:9999 (python3 pid 77)" in note.title
    assert note.evidence["ListenOverflows"] == 600 and note.evidence["own_listeners"][0]["drops"] == 0
    assert "nothing to change in this proxy" in note.fix


def test_own_drops_make_the_overflow_this_proxys_however_short_its_queue_lived():
    f = by_id(ns_ev(own_drops=3, others=[STUCK]))
    assert f["accept-queue-overflow"].severity == "high" and "other-listener-overflow" not in f
    assert f["accept-queue-overflow"].evidence["own_listener_drops"] == 3


def test_a_full_own_queue_now_is_a_finding_whatever_the_counters():
    f = by_id(ns_ev(own_drops=0, others=[STUCK], now_queued=4096))
    assert "accept-queue-overflow" in f and "other-listener-overflow" not in f


@pytest.mark.parametrize("own_queue, others, expected", [
    (3, [], "accept-queue-overflow"),                       # its queue was seen: its own
    (0, [STUCK], "other-listener-overflow"),                # never seen, another seen full
    (0, [], "accept-queue-overflow"),                       # cannot tell: as before, said so
])
def test_without_per_listener_drops_the_sampled_queues_decide(own_queue, others, expected):
    f = by_id(ns_ev(own_drops=None, own_queue=own_queue, others=others))
    assert expected in f
    if expected == "accept-queue-overflow" and not own_queue:
        assert "not attributed" in f[expected].evidence["attributed"]


def test_an_overflow_elsewhere_with_no_listener_left_to_name_is_still_not_this_proxys():
    f = by_id(ns_ev(own_drops=0, others=[]))
    assert "accept-queue-overflow" not in f and "no longer exists" in f["other-listener-overflow"].title


def test_syn_queue_counters_follow_the_same_attribution():
    f = by_id(ns_ev(own_drops=0, overflows=0, synq_drops=40, others=[STUCK]))
    assert "syn-backlog-overflow" not in f and f["other-listener-overflow"].evidence["TCPReqQFullDrop"] == 40
    # cookies drop nothing, so no listener counts them: they leave only when another listener is seen overflowing
    f = by_id(ns_ev(own_drops=0, overflows=0, cookies=40))
    assert f["syn-backlog-overflow"].severity == "medium"
    f = by_id(ns_ev(own_drops=0, overflows=500, cookies=40, others=[STUCK]))
    assert "syn-backlog-overflow" not in f and f["other-listener-overflow"].evidence["TCPReqQFullDoCookies"] == 40
    assert by_id(ns_ev(own_drops=2, overflows=0, synq_drops=40, others=[STUCK]))["syn-backlog-overflow"].severity \
        == "high"


def test_an_own_cap_reached_with_overflows_elsewhere_is_not_waiting():
    """owncap: clients waiting are this proxy's queue or its own drops, not the namespace's count."""
    ev = hap(PLAIN.replace("daemon", "daemon\n    maxconn 100"), clients=100, queued=0, overflows=900)
    ev["conns"]["listen_drops"] = {"available": True, "others": [STUCK]}
    ev["conns"]["ports"]["8080"]["drops"] = 0
    out = ranked(ev)
    assert out[0].id == "haproxy-maxconn" and out[0].severity == "medium"
    ev["conns"]["ports"]["8080"]["drops"] = 7
    assert ranked(ev)[0].severity == "high"


def test_each_listeners_drops_come_from_its_own_count():
    from proxytune.core.tcpdiag import Sock

    class Dumps:
        def __init__(self, socks):
            self.socks = socks

        def dump(self, **how):
            assert how == {"states": 1 << 10, "memory": True}
            return self.socks

    socks = [Sock("LISTEN", 0, 4096, "127.0.0.1:8080", "0.0.0.0:*", 111, drops=0),
             Sock("LISTEN", 5, 4, "127.0.0.1:9999", "0.0.0.0:*", 222, drops=613)]
    assert connsample.listener_drops(Dumps(socks)) == {
        111: {"local": "127.0.0.1:8080", "queued": 0, "backlog": 4096, "drops": 0},
        222: {"local": "127.0.0.1:9999", "queued": 5, "backlog": 4, "drops": 613}}
    socks[1].drops = None                                   # a kernel without the count: unknown, not 0
    assert connsample.listener_drops(Dumps(socks)) is None
    assert connsample.listener_drops(Dumps([])) == {} and connsample.listener_drops(None) is None



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


def test_a_written_maxconn_keeps_its_own_fix():
    ev = hap(PLAIN.replace("daemon", "daemon\n    maxconn 200"), clients=200, queued=9)
    out = ranked(ev)
    assert out[0].id == "haproxy-maxconn" and "raise `maxconn 200`" in out[0].fix
    assert "derived_maxconn" not in out[0].evidence

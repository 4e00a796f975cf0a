"""The proxies' caps on evidence: each proxy module's counting and the one
own-cap rule (owncap.py), without any proxy running. The live cases are in
test_proxies.py and the matrix files; these pin the mechanisms' edges."""

import os

import pytest

from proxytune import proxies as kinds
from proxytune.probes import findings, owncap, proxies_findings
from proxytune.proxies import base, haproxy

HAP_CFG = """global
    maxconn 200
defaults
    mode http
    maxconn 150
frontend fe_main
    bind 127.0.0.1:8080
    default_backend be
frontend fe_small
    bind :8081,:8082
    maxconn 20
listen admin 127.0.0.1:9000
    maxconn 500
backend be
    server o 127.0.0.1:80
"""


def hap_ev(clients: dict, queued: int = 0, overflows: int = 0, stats: dict | None = None, cfg: str = HAP_CFG,
           procs: dict | None = None) -> dict:
    lines = [base.Line("/etc/haproxy/haproxy.cfg", n, t) for n, t in enumerate(cfg.splitlines(), 1)]
    d = base.directives(lines, ("maxconn", "ulimit-n"), section="global")
    if fes := haproxy.sections(lines):
        d["frontends"] = fes
    st = {"available": True, "source": "show info on /s", **stats} if stats else {"available": False}
    return {"proxy": {"kind": "haproxy", "pid": 1, "config": "/etc/haproxy/haproxy.cfg", "directives": d,
                      "threads": 1, "stats_before": st, "stats_after": st},
            "procs": procs or {}, "listeners": [], "netstat": {"ListenOverflows": overflows},
            "conns": {"clients_peak": sum(clients.values()),
                      "ports": {p: {"clients_peak": n, "queued_peak": queued, "backlog": 100, "queued_samples": 1}
                                for p, n in clients.items()}}}


def accept_overflow() -> findings.Finding:
    return findings.Finding("accept-queue-overflow", "high", "t", {"ListenOverflows": 9, "per_s": 3.0},
                            "raise net.core.somaxconn")


def test_haproxy_sections_take_maxconn_from_their_own_line_or_the_defaults_before_them():
    lines = [base.Line("/c", n, t) for n, t in enumerate(HAP_CFG.splitlines(), 1)]
    fes = {f["name"]: f for f in haproxy.sections(lines)}
    assert fes["fe_main"]["maxconn"]["value"] == "150" and fes["fe_main"]["maxconn"]["from"] == "defaults"
    assert fes["fe_small"]["maxconn"] == {"value": "20", "line": 11, "file": "/c"}
    assert fes["fe_small"]["ports"] == ["8081", "8082"] and fes["admin"]["ports"] == ["9000"]


def test_haproxy_without_stats_socket_counts_sessions_not_fds_and_names_maxconn():
    """The issue's case: 1,500 idle keep-alive clients hold 200 sessions and no server connection; fds/2
    said 100 and the doctor blamed somaxconn."""
    ev = hap_ev({"8080": 199}, queued=101, overflows=4000,
                procs={"1": {"pid": 1, "fds_open": 210, "nofile_soft": 20000}})
    out = proxies_findings.refine([accept_overflow()], ev)
    assert [f.id for f in out] == ["haproxy-maxconn"] and out[0].severity == "high"
    assert "`maxconn 200`" in out[0].fix and "/etc/haproxy/haproxy.cfg:2" in out[0].fix
    assert "somaxconn only lengthens" in out[0].fix.replace("or a longer backlog ", "")
    assert out[0].evidence["kernel_symptom"]["finding"] == "accept-queue-overflow"


@pytest.mark.parametrize("sessions", [100, 150, 198])
def test_haproxy_below_its_maxconn_leaves_the_kernel_finding_alone(sessions):
    """One session short of the cap may be one in teardown (slack: one per thread, 2 here)."""
    cfg = "global\n    maxconn 200\nfrontend f\n    bind :8080\n"
    ev = hap_ev({"8080": sessions}, queued=5, overflows=9, cfg=cfg)
    ev["proxy"]["threads"] = 2
    out = proxies_findings.refine([accept_overflow()], ev)
    assert [f.id for f in out] == ["haproxy-maxconn" if sessions >= 198 else "accept-queue-overflow"]


def test_a_frontend_inherits_maxconn_from_the_defaults_before_it():
    out = proxies_findings.refine([accept_overflow()], hap_ev({"8080": 150}, queued=5, overflows=9))
    assert [f.id for f in out] == ["haproxy-maxconn"] and "(from `defaults`)" in out[0].title
    assert "/etc/haproxy/haproxy.cfg:5" in out[0].fix


def test_a_frontend_maxconn_below_the_global_one_is_its_own_finding():
    ev = hap_ev({"8080": 30, "8081": 12, "8082": 8}, queued=3)
    out = proxies_findings.refine([], ev)
    assert [f.id for f in out] == ["haproxy-maxconn"]
    assert "frontend fe_small" in out[0].title and "/etc/haproxy/haproxy.cfg:11" in out[0].fix
    assert set(out[0].evidence["accept_queue"]["listeners"]) == {"8081", "8082"}


def test_haproxy_stats_count_when_the_sockets_undercount():
    ev = hap_ev({"8080": 10}, queued=4, stats={"CurrConns": 200, "Maxconn": 200})
    out = proxies_findings.refine([], ev)
    assert [f.id for f in out] == ["haproxy-maxconn"] and out[0].evidence["used_peak"] == 200


def test_haproxy_maxconn_not_written_is_derived_from_its_fd_limit_and_said_to_be_an_estimate():
    """HAProxy 2.6 compute_ideal_maxconn: (fd limit - 10 reserved - listeners - 3 per thread) / 2; here no
    listener in the evidence and one thread."""
    cfg = "global\n    daemon\nfrontend f\n    bind :80\n"
    ev = hap_ev({"80": 493}, queued=9, cfg=cfg, procs={"1": {"pid": 1, "nofile_soft": 1000, "nofile_hard": 1000}})
    out = proxies_findings.refine([], ev)
    assert [f.id for f in out] == ["haproxy-maxconn"]
    assert out[0].evidence["limit_estimated"] and out[0].evidence["limit"] == (1000 - 10 - 0 - 3) // 2
    with_stats = proxies_findings.caps(hap_ev({"80": 498}, cfg=cfg, stats={"Maxconn": 497, "CurrConns": 497}))
    assert with_stats[0].limit == 497 and not with_stats[0].estimate


def nginx_ev(sockets: dict, wc: int = 128, mutex: bool = False, workers: str = "1", said: int = 0) -> dict:
    d = {"worker_connections": {"value": str(wc), "line": 3, "file": "/etc/nginx/conf.d/events.conf"},
         "worker_processes": {"value": workers, "line": 1}}
    if mutex:
        d["accept_mutex"] = {"value": "on", "line": 4}
    st = {"available": False, "not_enough_messages": said}
    return {"proxy": {"kind": "nginx", "pid": 1, "config": "/etc/nginx/nginx.conf", "directives": d,
                      "stats_before": {"available": False, "not_enough_messages": 0}, "stats_after": st},
            "procs": {}, "listeners": [], "netstat": {},
            "conns": {"pids": {"1": {"sockets_peak": 3}, **{str(p): {"sockets_peak": n} for p, n in sockets.items()}},
                      "ports": {"80": {"queued_peak": 0, "backlog": 511}}}}


@pytest.mark.parametrize("wc", [64, 128, 512, 16384])
def test_nginx_worker_at_the_lower_edge_of_its_drain_sawtooth_is_at_its_cap(wc):
    """ngx_drain_connections runs at 1/16 free and closes up to min(32, n/8): a worker under pressure
    never drops below n - n/16 - min(32, n/8) - 1; one connection fewer is no proof."""
    edge = wc - wc // 16 - min(32, wc // 8) - 1
    assert proxies_findings.own_findings(nginx_ev({2: edge - 1}, wc), {}) == []
    out = proxies_findings.own_findings(nginx_ev({2: edge, 3: 10}, wc), {})
    assert [f.id for f in out] == ["nginx-worker-connections"] and out[0].severity == "medium"
    assert "pid 2" in out[0].title and "/etc/nginx/conf.d/events.conf:3" in out[0].fix


@pytest.mark.parametrize("wc", [64, 128])
def test_nginx_worker_seen_at_its_drain_edge_only_by_the_fine_fd_count_is_at_its_cap(wc):
    """Bursts of reconnecting clients put a worker at n - n/16 for milliseconds (ngx_drain_connections
    fires there), then their upstreams close and it falls far below: the 0.25 s socket ticks can all land
    in the trough, the fd count read every 2 ms (less the non-socket fds) sees the top."""
    edge = wc - wc // 16 - min(32, wc // 8) - 1
    ev = nginx_ev({2: edge - 20}, wc)
    assert proxies_findings.own_findings(ev, {}) == []
    ev["conns"]["pids"]["2"].update(fds_peak_fine=edge + 5, sockets_peak_fine=edge - 1)
    assert proxies_findings.own_findings(ev, {}) == [], "one socket below the edge is no proof"
    ev["conns"]["pids"]["2"]["sockets_peak_fine"] = edge
    out = proxies_findings.own_findings(ev, {})
    assert [f.id for f in out] == ["nginx-worker-connections"] and out[0].evidence["used_peak"] == edge
    assert "pid 2" in out[0].title


def test_nginx_with_accept_mutex_stops_at_seven_eighths_and_its_alert_makes_it_high():
    assert proxies_findings.own_findings(nginx_ev({2: 111}, 128, mutex=True, workers="auto"), {}) == []
    assert proxies_findings.own_findings(nginx_ev({2: 112}, 128, mutex=True, workers="auto"), {})
    out = proxies_findings.own_findings(nginx_ev({2: 40}, 128, said=3), {})
    assert out[0].severity == "high" and out[0].evidence["refused_in_window"] == {"not_enough_messages": 3}


def test_trafficserver_throttles_accepts_with_ten_percent_headroom():
    def ev(open_now):
        return {"proxy": {"kind": "trafficserver", "config": "/r", "stats_before": {}, "stats_after": {},
                          "directives": {"proxy.config.net.connections_throttle": {"value": "1000", "line": 2}}},
                "procs": {}, "listeners": [], "netstat": {}, "conns": {"clients_peak": open_now, "upstream_peak": 0}}
    assert proxies_findings.own_findings(ev(909), {}) == []            # 909 x 1.1 < 1000
    assert [f.id for f in proxies_findings.own_findings(ev(910), {})] == ["trafficserver-connections-throttle"]


def test_no_limit_found_says_so_with_headroom_on_every_cap_and_resource():
    ev = hap_ev({"8080": 20}, procs={"1": {"pid": 1, "comm": "haproxy", "fds_open": 50, "nofile_soft": 4096}})
    ev["conns"]["ephemeral"] = {"peak_connected": 100, "at_end_with_time_wait": 3000, "range_size": 28232}
    ev["port_range"] = "32768 60999"
    rows = {r["what"]: r for r in owncap.headroom(proxies_findings.caps(ev), ev)}
    assert rows["haproxy global maxconn"]["used"] == 20 and rows["haproxy global maxconn"]["limit"] == 200
    assert rows["fds of pid 1 (haproxy)"]["share"] == round(50 / 4096, 3)
    assert rows["accept queue of port 8080"]["limit"] == 100
    eph = next(r for w, r in rows.items() if w.startswith("ephemeral ports"))
    assert eph["limit"] == 28232 and eph["used"] == 3000


def test_a_saturated_proxy_whose_only_finding_is_a_hotspot_is_cpu_bound():
    hot = findings.Finding("cpu-hotspot", "medium", "t", {"hot_self": [{"function": "f", "share": 0.2}],
                                                          "hot_own_code": [{"function": "g", "share": 0.3}],
                                                          "split": {"kernel": 0.6, "user": 0.4}}, "x")
    out = proxies_findings.cpu_bound([hot], {"cpu_cores": 0.98})
    assert [f.id for f in out] == ["cpu-bound"] and out[0].evidence["cpu_split"] == {"kernel": 0.6, "user": 0.4}
    assert proxies_findings.cpu_bound([hot], {"cpu_cores": 0.5}) == [hot]          # not saturated
    hot.evidence["hot_own_code"][0]["share"] = 0.6                                   # its own code dominates
    assert proxies_findings.cpu_bound([hot], {"cpu_cores": 0.98}) == [hot]


@pytest.mark.host  # reads the config in a child with the target's credentials (the tier: tests/tiers.py)
def test_includes_are_followed_with_file_and_line(tmp_path):
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "events.conf").write_text("events {\n    worker_connections 96;\n}\n")
    (tmp_path / "nginx.conf").write_text("worker_processes 2;\ninclude conf.d/*.conf;\nhttp { }\n")
    main = str(tmp_path / "nginx.conf")
    lines, unread = base.config_lines(os.getpid(), main, None, kinds.nginx.INCLUDE)
    d = base.directives(lines, ("worker_connections", "worker_processes"))
    assert unread == []
    assert base.where(d, "worker_connections", main) == f"{tmp_path}/conf.d/events.conf:2"
    assert base.where(d, "worker_processes", main) == f"{main}:1"


@pytest.mark.host  # reads the config in a child with the target's credentials (the tier: tests/tiers.py)
def test_an_include_loop_and_a_missing_include_end():
    import tempfile
    with tempfile.TemporaryDirectory() as t:
        a = os.path.join(t, "a.conf")
        with open(a, "w") as fh:
            fh.write(f"include {a};\ninclude {t}/missing.conf;\nworker_connections 1;\n")
        lines, unread = base.config_lines(os.getpid(), a, None, kinds.nginx.INCLUDE)
        assert len(lines) <= base.MAX_CONFIG_FILES + 1 and any("missing.conf" in u for u in unread)


def test_every_registered_proxy_says_how_to_recognise_it():
    for k in kinds.KINDS:
        assert k.kind and k.exe_names and k.unit and k.user and k.package, k
        assert k.profile() == f"linux/{k.kind}"
    assert kinds.names() == ["squid", "nginx", "haproxy", "varnish", "trafficserver"]


def test_varnish_without_varnishstat_counts_its_cache_worker_threads():
    d = {"thread_pools": {"value": "2", "where": "varnishd default"},
         "thread_pool_max": {"value": "10", "where": "varnishd command line (-p)"},
         "thread_queue_limit": {"value": "20"}}
    def ev(workers):
        return {"proxy": {"kind": "varnish", "config": "/v.vcl", "directives": d,
                          "stats_before": {"available": False}, "stats_after": {"available": False}},
                "procs": {}, "listeners": [], "netstat": {},
                "conns": {"pids": {"1": {"workers_peak": 0}, "2": {"workers_peak": workers}}}}
    assert proxies_findings.own_findings(ev(19), {}) == []
    out = proxies_findings.own_findings(ev(20), {})
    assert [f.id for f in out] == ["varnish-thread-pool"] and out[0].evidence["counted"].startswith("cache-worker")


@pytest.mark.parametrize("kind,names", [("nginx", "backlog="), ("haproxy", "`backlog 8192`"), ("squid", "Squid_MaxFD >> 2"),
                                        ("varnish", "listen_depth"), ("trafficserver", "listen_backlog")])
def test_queue_overflows_name_the_proxys_own_backlog(kind, names):
    ev = {"proxy": {"kind": kind, "config": "/c", "directives": {}, "stats_before": {}, "stats_after": {}},
          "procs": {}, "listeners": [], "netstat": {}, "conns": {}}
    for fid in ("accept-queue-overflow", "syn-backlog-overflow"):
        out = proxies_findings.refine([findings.Finding(fid, "high", "t", {}, "generic")], ev)
        assert [f.id for f in out] == [fid] and names in out[0].fix and "syncookies = 1" in out[0].fix


def test_the_syn_queue_fix_names_the_listen_backlog_not_tcp_max_syn_backlog():
    ev = {"netstat": {"TCPReqQFullDrop": 5}, "bpf_window_s": 1, "window_s": 1}
    f = findings.syn_backlog_overflow(ev)
    assert "listen backlog" in f.fix and not f.fix.startswith("raise net.ipv4.tcp_max_syn_backlog")


def test_nginx_and_squid_name_their_own_cache_dirs(tmp_path):
    from proxytune.proxies.nginx import RunningNginx
    from proxytune.proxies.squid import RunningSquid
    n = RunningNginx.__new__(RunningNginx)
    n.lines = [base.Line("/c", 1, "http { proxy_cache_path /var/cache/ng levels=1:2 keys_zone=z:10m; }"),
               base.Line("/c", 2, "  proxy_cache_path /srv/two;  # second")]
    s = RunningSquid.__new__(RunningSquid)
    s.lines = [base.Line("/c", 1, "cache_dir rock /var/spool/squid 1000"), base.Line("/c", 2, "#cache_dir ufs /x 1 1 1")]
    assert n.cache_dirs() == ["/var/cache/ng", "/srv/two"] and s.cache_dirs() == ["/var/spool/squid"]


def test_a_syn_queue_overflow_behind_a_proxy_at_its_cap_is_folded_into_the_cap():
    syn = findings.Finding("syn-backlog-overflow", "high", "t", {"TCPReqQFullDrop": 40}, "raise the listen backlog")
    out = proxies_findings.refine([accept_overflow(), syn], hap_ev({"8080": 150}, queued=101, overflows=40))
    assert [f.id for f in out] == ["haproxy-maxconn"]
    assert out[0].evidence["kernel_symptom"]["also"]["syn-backlog-overflow"] == {"TCPReqQFullDrop": 40}


@pytest.mark.parametrize("location", ["/nginx_status", "= /nginx_status"])
def test_stub_status_in_either_location_form(location):
    from proxytune.proxies.nginx import RunningNginx
    n = RunningNginx.__new__(RunningNginx)
    n.lines = [base.Line("/c", i, t) for i, t in enumerate(
        ["http {", "  server {", "    listen 127.0.0.1:8081;", f"    location {location} {{ stub_status; }}",
         "  }", "}"], 1)]
    assert n.parse()["stub_status"]["value"] == "127.0.0.1:8081 /nginx_status"


def squid_ev(mgr_used: int | None, proc_open: int) -> dict:
    mgr = {"available": True, "max_fds": 256, "fds_in_use": mgr_used} if mgr_used is not None else \
        {"available": False, "reason": "deferred"}
    return {"proxy": {"kind": "squid", "directives": {}, "config": None, "stats_before": mgr, "stats_after": mgr},
            "procs": {"7": {"fds_open": proc_open, "nofile_soft": 256, "fd_use": proc_open / 256}}}


@pytest.mark.parametrize("mgr_used,proc_open,reached,counted", [
    (30, 200, True, "/proc"),          # the manager answered at the ends, the peak came between them
    (None, 200, True, "/proc"),        # deferred at the cap: only /proc counts
    (200, 30, True, "cache manager"),  # the manager saw the peak; /proc read after it fell
    (30, 40, False, "/proc"),          # far below: 256 - 2*64 - 5 = 123 is where squid starts refusing
])
def test_squid_fd_cap_counts_the_larger_of_its_manager_and_proc(mgr_used, proc_open, reached, counted):
    """squid src/fd.cc RESERVED_FD, src/comm/TcpAcceptor.cc okToAccept: squid turns keep-alive off and defers accepting by its own count;
    the cache manager can only answer while squid still accepts, so it alone misses a peak mid-window."""
    from proxytune.proxies.squid import Squid
    (cap,) = Squid.caps(squid_ev(mgr_used, proc_open))
    assert cap.limit == 256 and cap.refuses_at == 123
    assert cap.reached() is reached and counted in cap.counted

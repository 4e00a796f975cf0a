"""The matrix's own harness, without root or proxies: the held clients really
sit in a listener's accept queue and notice when they are closed, the
verdict and condition checks fail where they must, the cells cover what the
matrix promises, and the page renders results as Markdown text."""

import json
import socket
import time

import pytest

import diagnosis_doc
import matrix


def _doc(ids, fixes=None, evidence=None, **ev):
    found = [{"id": i, "severity": "high", "fix": (fixes or {}).get(i, "do x"), "evidence": evidence or {}}
             for i in ids]
    base = {"listeners": [], "connections": {"clients": 0, "total": 0}, "procs": {}, "proxy": {}}
    return {"findings": found, "data": {"evidence": {**base, **ev}}}


def test_idle_clients_wait_in_the_accept_queue_and_see_their_close():
    with socket.socket() as lsn:
        lsn.bind(("127.0.0.1", 0))
        lsn.listen(4)                                  # the kernel holds backlog + 1 completed handshakes
        port = lsn.getsockname()[1]
        with matrix.IdleClients(port, 12, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") as idle:
            assert idle.wait(5, 5) == 5                # queued, never accepted: their request is sent
            time.sleep(0.5)
            assert idle.sent == 5 and idle.closed == 0
            conn, _ = lsn.accept()
            assert conn.recv(100).startswith(b"GET / ")
            conn.close()
            deadline = time.monotonic() + 5
            while idle.closed < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert idle.closed == 1


def test_verdict_wants_the_own_cap_first_with_directive_and_where():
    cell = matrix.BY_NAME["haproxy-busy-global50-stats"]
    good = {"haproxy-maxconn": "raise `maxconn 50` in the global section of /c.cfg:2; net.core.somaxconn "
                               "only lengthens the queue"}
    assert matrix.verdict_problems(cell, _doc(["haproxy-maxconn"], good), "/c.cfg:2") == []
    assert matrix.verdict_problems(cell, _doc(["haproxy-maxconn"], good), "/c.cfg:9")        # wrong line
    bad = matrix.verdict_problems(cell, _doc(["accept-queue-overflow", "haproxy-maxconn"],
                                             {**good, "accept-queue-overflow": "raise net.core.somaxconn"}), "/c.cfg:2")
    assert any("first finding" in p for p in bad) and any("somaxconn" in p for p in bad)
    advise = {"haproxy-maxconn": "raise `maxconn 50` (/c.cfg:2) and net.core.somaxconn"}
    assert matrix.verdict_problems(cell, _doc(["haproxy-maxconn"], advise), "/c.cfg:2")


def test_healthy_verdict_allows_low_findings_only():
    cell = matrix.BY_NAME["squid-healthy"]
    low = _doc(["cache-dir-atime"])
    low["findings"][0]["severity"] = "low"
    assert matrix.verdict_problems(cell, low, "") == []
    assert matrix.verdict_problems(cell, _doc(["accept-queue-overflow"]), "")


def test_condition_reads_the_proxys_own_count():
    cell = matrix.BY_NAME["haproxy-idle-global200-nostats"]
    below = _doc([], listeners=[{"queued": 50}], connections={"clients": 120, "total": 120})
    at = _doc([], listeners=[{"queued": 50}], connections={"clients": 200, "total": 200})
    assert matrix.condition_problems(cell, below) and not matrix.condition_problems(cell, at)
    healthy = matrix.BY_NAME["haproxy-healthy"]
    assert matrix.condition_problems(healthy, _doc([], connections={"clients": 0, "total": 0}))


def test_cells_cover_every_proxy_shape_cap_and_stats_interface():
    for proxy in matrix.OWN:
        cells = [c for c in matrix.CELLS if c.proxy == proxy]
        assert {c.shape for c in cells} - {"cpu"} == {"idle", "busy", "slow", "healthy"}, proxy
        assert len({c.cap_value for c in cells if c.shape not in ("healthy", "cpu")}) >= 2, proxy
        if proxy != "varnish":                          # varnishstat is always there
            assert {c.stats for c in cells if c.shape != "healthy"} == {True, False}, proxy
        for c in cells:
            if c.shape in ("idle", "busy", "slow"):
                assert c.idle + c.wrk > c.cap_value or c.proxy == "varnish", c.name
    assert [c.name for c in matrix.CELLS if c.issue] == ["haproxy-idle-global200-nostats",
                                                        "haproxy-idle-derived-fd256-nostats",
                                                        "nginx-busy-wc128x1-nostatus",
                                                        "nginx-healthy-paced2w-perf"]
    # issue 28's misses, each on two shapes: a derived haproxy maxconn (idle and busy, two fd limits, the
    # backlog read back or hidden), the hotspot rule on a loop far from and at a full core
    derived = [c for c in matrix.CELLS if c.derived]
    assert {c.shape for c in derived} == {"idle", "busy"} and len({c.opts["nofile"] for c in derived}) == 2
    assert {c.shape for c in matrix.CELLS if c.perf} == {"healthy", "cpu"}
    issue = matrix.BY_NAME["haproxy-idle-global200-nostats"]
    assert (issue.idle, issue.wrk, issue.opts) == (1500, 50, {"maxconn": 200, "stats_socket": False})


def test_page_escapes_what_a_result_file_says():
    line = {"cell": "haproxy-busy-global50-stats", "run": 0, "passed": False, "problems": ["rule"],
            "ids": ["x|y"], "fix": "a | b\n<script>", "proxy": "haproxy"}
    text = diagnosis_doc.render([line])
    row = next(r for r in text.splitlines() if "haproxy-busy-global50-stats" in r)
    assert "x\\|y" in row and "a \\| b &lt;script&gt;" in row and "FAIL (rule: x|y)" not in row
    assert "## How a rule is added" in text


@pytest.mark.parametrize("cell", [c for c in matrix.CELLS if c.proxy != "varnish"], ids=lambda c: c.name)
def test_expected_where_is_the_line_the_cap_is_on(cell, tmp_path, monkeypatch):
    """The server classes write the cap where the cell expects it (no server is started)."""
    import shutil
    from proxytune.proxies import haproxy, nginx, squid, trafficserver, varnish
    for module in (haproxy, nginx, squid, trafficserver, varnish):
        monkeypatch.setattr(module, "need", lambda *a: "/bin/true")
    monkeypatch.setattr(shutil, "chown", lambda *a, **k: None)
    monkeypatch.setattr(shutil, "copytree", lambda *a, **k: None)
    srv, conf = matrix.server(cell, 8080)
    try:
        where = matrix.expected_where(cell, conf)
        if cell.derived:                                # no maxconn written: the config is named, not a line
            assert where == f"{conf} (not set)" and "maxconn" not in conf.read_text().split("defaults")[0]
            return
        path, line = where.rsplit(":", 1)
        text = open(path).read().splitlines()[int(line) - 1]
        assert matrix.DIRECTIVE[cell.proxy] in text, (where, text)
        if cell.proxy == "nginx" and cell.opts.get("events_include"):
            assert path.endswith("events.conf") and f"include {path};" in (srv.dir / "nginx.conf").read_text()
    finally:
        shutil.rmtree(srv.dir, ignore_errors=True)
        if isinstance(srv, matrix.WithDir):
            shutil.rmtree(srv.path, ignore_errors=True)


def test_derived_cells_want_the_limit_haproxy_said_and_both_moved_together():
    cell = matrix.BY_NAME["haproxy-idle-derived-fd256-nostats"]
    fix = "set maxconn and the fd limit together: haproxy has no maxconn in its global section (/c.cfg (not set))"
    doc = _doc(["haproxy-maxconn"], {"haproxy-maxconn": fix}, evidence={"limit": 119})
    doc["matrix"] = {"haproxy_maxconn": 119}
    assert matrix.verdict_problems(cell, doc, "/c.cfg (not set)") == []
    doc["matrix"]["haproxy_maxconn"] = 124                                 # the doctor missed haproxy's figure
    assert any("haproxy -V says" in p for p in matrix.verdict_problems(cell, doc, "/c.cfg (not set)"))
    old = _doc(["haproxy-maxconn"], {"haproxy-maxconn": "raise maxconn (/c.cfg (not set))"}, evidence={"limit": 119})
    assert any("fd limit together" in p for p in matrix.verdict_problems(cell, old, "/c.cfg (not set)"))
    at = _doc([], listeners=[{"queued": 9}], connections={"clients": 119, "total": 119})
    assert matrix.condition_problems(cell, at)                              # no figure from haproxy: not proven
    at["matrix"] = {"haproxy_maxconn": 119}
    assert not matrix.condition_problems(cell, at)


def test_hotspot_cells_judge_the_loop_not_the_share():
    healthy, cpu = matrix.BY_NAME["nginx-healthy-paced2w-perf"], matrix.BY_NAME["nginx-cpu-gzip9x1-perf"]
    quiet = _doc([])
    quiet["data"]["headroom"] = [{"what": "CPU of its busiest thread", "top_functions": [{"function": "f"}]}]
    assert matrix.verdict_problems(healthy, quiet, "") == []
    low = _doc(["cpu-hotspot"])
    low["findings"][0]["severity"] = "low"
    low["data"]["headroom"] = quiet["data"]["headroom"]
    assert matrix.verdict_problems(healthy, low, "") == ["cpu-hotspot raised"]
    assert matrix.verdict_problems(healthy, _doc([]), "") == ["no top functions in headroom"]
    assert matrix.verdict_problems(cpu, _doc(["cpu-bound"]), "") == []
    assert matrix.verdict_problems(cpu, _doc(["accept-queue-overflow", "cpu-hotspot"]), "")
    busy = {"perf": {"top": [{"share": 0.3}]}, "connections": {"clients": 40, "total": 80}}
    doc = _doc([], cpu_cores=0.4, **busy)
    doc["matrix"] = {"requests_per_s": 3000}
    assert matrix.condition_problems(healthy, doc) == []
    doc["matrix"] = {"requests_per_s": 300}                                # not the busy proxy of the issue
    assert matrix.condition_problems(healthy, doc)
    assert matrix.condition_problems(healthy, _doc([], cpu_cores=0.1, **busy))
    assert matrix.condition_problems(cpu, _doc([], cpu_cores=0.5)) and not matrix.condition_problems(
        cpu, _doc([], cpu_cores=0.97))


def test_the_kept_run_shows_the_condition_and_the_majority_outcome():
    runs = [{"run": 0, "passed": True, "problems": ["harness: missed"]},
            {"run": 1, "passed": False, "problems": ["rule"]},
            {"run": 2, "passed": False, "problems": ["rule"]}]
    assert diagnosis_doc.representative(runs)["run"] == 1
    runs[1]["passed"], runs[1]["problems"] = True, []
    assert diagnosis_doc.representative(runs)["run"] == 1


def test_regenerating_the_own_cap_page_keeps_its_latency_section(tmp_path):
    """CI runs only the lean latency cells: the full matrix's section stays when no --latency is given."""
    line = {"cell": "haproxy-busy-global50-stats", "run": 0, "passed": True, "problems": [], "ids": ["x"],
            "fix": "f", "proxy": "haproxy"}
    results = tmp_path / "r.jsonl"
    results.write_text(json.dumps(line) + "\n")
    dest = tmp_path / "D.md"
    section = f"{diagnosis_doc.LATENCY_HEAD}\n\n| cell |\n\n### Budgets as printed\n\n`kept` look 1\n"
    dest.write_text("# old\n\n" + section + "\n## How a rule is added\n\nold how\n")
    assert diagnosis_doc.main([str(results), str(dest)]) == 0
    text = dest.read_text()
    assert text.count(diagnosis_doc.LATENCY_HEAD) == 1 and "`kept` look 1" in text
    assert text.index("`kept` look 1") < text.index("## How a rule is added") and "# old" not in text

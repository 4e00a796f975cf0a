"""The latency matrix's harness, pure: wrk's summary read right, and each
verdict failing where it must (a verdict that cannot fail proves nothing)."""

import pytest

import latency_cells as lc

WRK = """Running 10s test @ http://127.0.0.1:8080/
  2 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   302.51ms    2.10ms 320.00ms   90.00%
    Req/Sec    26.10      5.00    40.00     80.00%
  528 requests in 10.01s, 80.00KB read
  Socket errors: connect 0, read 0, write 0, timeout 2
Requests/sec:     52.75
"""


def test_wrk_summary():
    got = lc.wrk_summary(WRK)
    assert got["mean_ms"] == 302.51 and got["requests"] == 528 and got["errors"]["timeout"] == 2
    assert lc.wrk_summary(WRK.replace("302.51ms", "812.00us"))["mean_ms"] == 0.812
    assert lc.wrk_summary(WRK.replace("302.51ms", "1.20s"))["mean_ms"] == 1200
    assert lc.wrk_summary("")["mean_ms"] is None


def doc(first: str | None, total: float, origin_ms: float = 300, text: str = "", dominant=None,
        evidence: dict | None = None) -> dict:
    found = [{"id": first, "severity": "medium", "title": text, "fix": text, "evidence": evidence or {}}] if first else []
    parts = {"origin_first_byte": {"ms": origin_ms, "measurable": True,
                                   "by_origin": {"127.0.0.1:9000": {"ms": origin_ms}}}}
    return {"findings": found, "data": {"budget": {"total_ms": total, "parts": parts, "dominant": dominant}}}


FACTS = {"origin": "127.0.0.1:9000", "where": "/tmp/h/haproxy.cfg:12", "client_ms": 310.0, "delay_ms": 300}


def test_slow_cell_verdicts():
    cell = lc.BY_NAME["haproxy-slow200-stats"]
    m = {**FACTS, "client_ms": 205.0}
    assert not lc.verdict_problems(cell, doc("slow-origin", 200, 198, "origin 127.0.0.1:9000"), m)
    assert "not within 25 %" in " ".join(lc.verdict_problems(cell, doc("slow-origin", 200, 140, "127.0.0.1:9000"), m))
    assert "does not name" in " ".join(lc.verdict_problems(cell, doc("slow-origin", 200, 198, "an origin"), m))
    assert "expected slow-origin" in " ".join(lc.verdict_problems(cell, doc("proxy-queue", 200), m))
    assert "not within 30 %" in " ".join(lc.verdict_problems(cell, doc("slow-origin", 100, 198, "127.0.0.1:9000"),
                                                             m))


def test_queue_cell_verdicts():
    cell = lc.BY_NAME["haproxy-queue-mc4"]
    good = "behind `server o 127.0.0.1:9000 maxconn 4` (/tmp/h/haproxy.cfg:12)"
    waited = {"wait_ms_per_request": 250.0}
    assert not lc.verdict_problems(cell, doc("proxy-queue", 300, 50, good, evidence=waited), FACTS)
    assert "queue's wait" in " ".join(lc.verdict_problems(cell, doc("proxy-queue", 300, 50, good), FACTS))
    assert "directive" in " ".join(lc.verdict_problems(cell, doc("proxy-queue", 300, 50, "maxconn 40 at "
                                                                 "/tmp/h/haproxy.cfg:12"), FACTS))
    assert "where it is set" in " ".join(lc.verdict_problems(cell, doc("proxy-queue", 300, 50, "maxconn 4"), FACTS))
    varnish = lc.BY_NAME["varnish-queue-max10x1"]                # the own cap that queues comes first, with the wait
    m = {**FACTS, "where": "command line"}
    cap = "varnish is at its worker threads (1 pools x thread_pool_max 10) 10 (command line)"
    assert not lc.verdict_problems(varnish, doc("varnish-thread-pool", 300, 100, cap,
                                                evidence={"queue_wait_ms_per_request": 190.0}), m)
    assert "expected varnish-thread-pool" in " ".join(lc.verdict_problems(varnish, doc("proxy-queue", 300, 100, cap,
                                                                                       evidence=waited), m))
    assert "queue's wait" in " ".join(lc.verdict_problems(varnish, doc("varnish-thread-pool", 300, 100, cap), m))


def test_fast_cell_verdicts():
    cell = lc.BY_NAME["nginx-fast"]
    m = {**FACTS, "client_ms": 0.8}
    assert not lc.verdict_problems(cell, doc(None, 0.4, 0.1), m)          # within the clocks' 1 ms
    assert "fast proxy, yet" in " ".join(lc.verdict_problems(cell, doc("slow-origin", 0.4, 0.1), m))
    assert not lc.verdict_problems(cell, doc(None, 0.4, 0.3, dominant="origin_first_byte"), m)   # sub-ms noise
    assert "budget total" in " ".join(lc.verdict_problems(cell, doc(None, 45, 0.3), {**m, "client_ms": 45}))
    assert "not within" in " ".join(lc.verdict_problems(cell, doc(None, 4.0, 0.1), m))


@pytest.mark.parametrize("cell", lc.CELLS, ids=lambda c: c.name)
def test_cells_are_well_formed(cell):
    assert cell.proxy in ("haproxy", "varnish", "squid", "trafficserver", "nginx")
    assert (cell.delay > 0) == (cell.shape != "fast") and (cell.cap > 0) == (cell.shape == "queue")
    assert cell.shape != "fast" or cell.pause_ms, "a fast cell is paced"


def test_every_proxy_has_its_shapes():
    shapes = {(c.proxy, c.shape) for c in lc.CELLS}
    for proxy in ("haproxy", "varnish", "squid", "trafficserver", "nginx"):
        assert {(proxy, "fast"), (proxy, "slow")} <= shapes
    assert {("haproxy", "queue"), ("varnish", "queue"), ("trafficserver", "queue")} <= shapes
    delays = {c.delay for c in lc.CELLS if c.shape == "slow"}
    assert len(delays) >= 2 and {c.stats for c in lc.CELLS if c.shape == "slow"} == {True, False}


def test_the_lean_matrix_keeps_every_mechanism():
    """What CI plays of the matrix: each proxy, each shape, each proxy's own clock behind a slow origin, a queue
    (the kernel's alone: test_budget_live.py; Varnish's and Traffic Server's queues: test_owntime_live.py)."""
    lean = [lc.BY_NAME[n] for n in lc.LEAN]
    assert {c.proxy for c in lean} == {c.proxy for c in lc.CELLS}
    import test_owntime_live as live
    assert {"test_varnish_queue_for_a_worker", "test_trafficserver_queue_per_origin"} <= set(live.IN_CI)
    assert {c.shape for c in lean} == {"fast", "slow", "queue"}
    assert {c.proxy for c in lean if c.shape == "slow" and c.stats} == {c.proxy for c in lc.CELLS}
    assert any(c.shape == "queue" for c in lean)


def test_a_wait_the_kernel_could_only_bound_is_judged_by_its_bounds():
    """Behind reused origin connections the kernel alone gives [lower, upper]: the real delay must lie within
    them, the finding must say 'at least', and wrk's mean must lie between the total and its upper bound."""
    cell = lc.BY_NAME["haproxy-slow400-nostats"]
    m = {**FACTS, "client_ms": 403.0}

    def bounded(low, high, title):
        d = doc("slow-origin", low, low, f"requests wait {title} ({FACTS['origin']})")
        part = d["data"]["budget"]["parts"]["origin_first_byte"]
        part.update({"at_least": True, "ms_upper": high})
        part["by_origin"][FACTS["origin"]]["ms_upper"] = high
        return d
    assert not lc.verdict_problems(cell, bounded(60, 403, "at least 60 ms (at most 403 ms)"), m)
    assert "'at least'" in " ".join(lc.verdict_problems(cell, bounded(60, 403, "60 ms"), m))
    assert "not within the bounds" in " ".join(lc.verdict_problems(cell, bounded(60, 200, "at least 60 ms"), m))
    assert lc.agreement(bounded(60, 403, "x"), 403.0)["agrees"]
    assert not lc.agreement(bounded(60, 200, "x"), 403.0)["agrees"]


def test_the_total_agrees_within_what_the_clocks_state():
    d = doc(None, 3.6, 3.5)
    assert not lc.agreement(d, 0.67)["agrees"]
    d["data"]["budget"]["parts"]["origin_first_byte"]["uncertainty_ms"] = 6.4      # haproxy's stated half-width
    assert lc.agreement(d, 0.67)["agrees"]


TAILED = """Running 10m test @ http://127.0.0.1:51209/
  2 threads and 24 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   643.13ms  866.65ms   4.47s    84.19%
    Req/Sec    38.31     15.80    80.00     59.79%
  1125 requests in 15.02s, 197.75KB read
Requests/sec:     74.90
"""


def test_client_mean_undoes_nothing_when_wrk_added_nothing():
    """wrk.c stats_correct adds samples only for latencies above twice its expected interval: below, its
    printed mean is the requests' mean."""
    ms, how = lc.client_mean(lc.wrk_summary(WRK.replace("timeout 2", "timeout 0")))
    assert ms == 302.51 and "not corrected" in how
    ms, how = lc.client_mean(lc.wrk_summary(WRK))          # 2 past its timeout: not in its mean, in Little's law
    assert ms == pytest.approx(16 * 10010 / 528, abs=0.01) and "past wrk's timeout" in how


def test_client_mean_of_a_tailed_load_is_littles_law_on_wrks_counts():
    """A live Traffic Server queue (max 4, 24 clients): wrk printed 643 ms, the proxy logged 1,144
    transactions averaging 315 ms; wrk's counts give 24 x 15.02 s / 1125 = 320 ms."""
    w = lc.wrk_summary(TAILED)
    assert (w["max_ms"], w["connections"], w["runtime_ms"]) == (4470.0, 24, 15020.0)
    ms, how = lc.client_mean(w)
    assert ms == pytest.approx(320.43, abs=0.01) and "coordinated omission" in how
    assert lc.client_mean(w, pause_ms=100)[0] == pytest.approx(220.43, abs=0.01)
    # connections starved in an accept queue inflate Little's law: the printed mean, also an upper bound, is smaller
    starved = {**w, "mean_ms": 210.0, "max_ms": 1000.0, "runtime_ms": 5000.0, "requests": 300}
    assert lc.client_mean(starved, pause_ms=100) == (210.0, pytest.approx(lc.client_mean(starved, 100)[1]))
    assert "below Little's law" in lc.client_mean(starved, 100)[1]
    # a request past --timeout is in Little's law, not in wrk's mean; too few requests leave the printed mean
    assert lc.client_mean({**starved, "errors": {"timeout": 2}}, 100)[0] == pytest.approx(300.0)
    assert lc.client_mean({**w, "requests": 50, "runtime_ms": 1000.0}, pause_ms=600)[0] == 643.13
    assert lc.client_mean({**w, "max_ms": None})[0] == 643.13      # an unreadable max: the printed mean, named

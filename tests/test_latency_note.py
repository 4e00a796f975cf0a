"""The report explains its latency (reports/latency.py): where wrk's p50 and Squid's own (its
access.log elapsed) disagree by more than 2x, a note says how much of each request is outside
Squid's clock and which queue holds it (the run's time budget), or that it is unexplained."""

from proxytune.reports import latency, tables


def _store(wrk_ms: float, own_ms: float | None, budget: dict | None = None) -> dict:
    """p50s as given, means 10 % above them."""
    s = {"steady": {"latency_us": {"p50": wrk_ms * 1000, "mean": wrk_ms * 1100}},
         "service_ms": None if own_ms is None else {"p50": own_ms, "mean": own_ms * 1.1}}
    return {**s, "budget": budget} if budget else s


def _part(ms):
    return {"ms": ms, "measurable": ms is not None}


def test_clocks_that_agree_within_2x_need_no_note():
    assert latency.explain(_store(3.0, 2.0), "after #1") is None
    assert latency.explain(_store(3.0, None), "after #1") is None         # no clock of Squid's: nothing compared


def test_a_gap_without_a_budget_is_said_unexplained_with_what_would_explain_it():
    note = latency.explain(_store(155.0, 2.0), "after #1")
    assert note.startswith("after #1: wrk's p50 155.0 ms against Squid's own 2 ms")
    assert "x77.5" in note and "153.0 ms of each request is outside Squid's clock" in note
    assert "unexplained here: this run had no time budget" in note
    assert "unexplained here: no bpftrace" in latency.explain({**_store(155.0, 2.0), "budget_unavailable": "no bpftrace"},
                                                               "x")


def test_a_sub_millisecond_squid_is_compared_against_1_ms():
    assert latency.gap(_store(17.6, 0))["ratio"] == 17.6


def test_a_budget_names_the_queue_that_holds_the_difference():
    parts = {"accept_queue": _part(1.0), "proxy_queue": _part(120.0), "proxy_self": _part(2.0),
             "origin_connect": _part(None)}
    note = latency.explain(_store(155.0, 2.0, {"parts": parts}), "before #2")
    # means: wrk 170.5 ms, Squid 2.2 ms: 168.3 ms; the queues hold 121 ms of it
    assert "proxy queue 120.0 ms, accept queue 1.0 ms a request (means): 72% of the mean difference, 168.3 ms" in note
    assert "unexplained" not in note
    parts["proxy_queue"] = _part(10.0)
    assert "the rest is unexplained" in latency.explain(_store(155.0, 2.0, {"parts": parts}), "before #2")
    only_self = {"proxy_self": _part(2.0)}
    assert "unexplained: the time budget measured neither" in latency.explain(_store(155.0, 2.0, {"parts": only_self}), "x")


def test_the_proxy_section_labels_each_round_and_carries_the_notes():
    run = lambda label, rnd, wrk_ms: {
        "label": label, "round": rnd, "store": "ufs", "nofile": [1024, 20000], "hit_ratio": 0.5, "service_ms": {"p50": 2},
        "error_count": 0,
        "fill": {"rps": 1.0}, "steady": {"rps": 2.0, "mb_per_s": 1.0, "latency_us": {"p50": wrk_ms * 1000, "p99": 1e5}},
        "latency_probe": {}, "errors": {"wrk_socket": {}, "http_status": 0, "squid_codes": {}, "idle_clients_failed": {},
                                        "idle_clients_dropped": 0, "fd_warnings_in_cache_log": 0}}
    r = {"plan": {"concurrency": 400, "idle": 1000, "fill_s": 1, "steady_s": 3}, "docroot": {"files": 500, "mean_kb": 10.0},
         "repeat": 0.55, "compare_profile": "linux/squid", "stores": [run("before", 0, 150.0), run("after", 0, 3.0)],
         "rounds": [{"before": 0, "after": 1}], "service_nofile": {"before": 1024, "after": 65536, "capped": True,
                                                                   "hard_limit_here": 20000},
         "applied": [], "rolled_back": True}
    labels, _ = tables.proxy_rows(r)
    assert labels == ["before #1", "after #1"]
    sec = tables.proxy_section(r)
    assert "1 alternating rounds" in sec.intro
    gaps = [n for n in sec.notes if "wrk's p50" in n]        # no run watched: one line, said unexplained
    assert gaps == ["wrk's p50 against Squid's own, runs without a time budget: before #1 x75.0; unexplained here: "
                    "no run of this result had a time budget"], sec.notes
    # as the report lays them out: the warm-up first, watched by the doctor, no pair's side
    from proxytune.microbench.hostsettings import WARM_UP
    warm = {**run(WARM_UP, 0, 160.0), "budget": {"parts": {"accept_queue": _part(150.0)}}}
    del warm["round"]
    r["stores"].insert(0, warm)
    r["rounds"] = [{"before": 1, "after": 2}]
    labels, _ = tables.proxy_rows(r)
    assert labels == [WARM_UP, "before #1", "after #1"]
    gaps = [n for n in tables.proxy_section(r).notes if "wrk's p50" in n]
    assert gaps[0].startswith(f"{WARM_UP}: wrk's p50 160.0 ms") and "accept queue 150.0 ms" in gaps[0], gaps
    assert gaps[1].endswith("before #1 x75.0; the watched run above says where its own gap went") and len(gaps) == 2
    warm.update(budget=None, budget_unavailable="bpftrace is not installed")   # the doctor could not attach
    gaps = [n for n in tables.proxy_section(r).notes if "wrk's p50" in n]
    assert "bpftrace is not installed" in gaps[0], gaps

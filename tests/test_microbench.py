"""The C harnesses and what they must show: they build with -Wall -Wextra
-Werror, their JSON fits the schema, a mechanism the platform lacks is
reported unavailable with its reason, and the physics holds with wide
margins (ratios measured in one run, never absolute times):
  - poll/select cost per call grows ~linearly with idle descriptors,
    epoll and io_uring stay flat;
  - Mogul's variant 1 misses D1 several times more than variant 3, and
    variant 5 is the fastest.
"""

import json
import shutil
import subprocess

import pytest

from proxytune.core.capability import perf_counts
from proxytune.core import stats
from proxytune.microbench import build, events, fdscan
from proxytune.reports import measurements
from proxytune.microbench.runner import run_json
from proxytune.reports.schema import envelope, validate

pytestmark = pytest.mark.host       # they build the harnesses with cc and run them (the tier: tests/tiers.py)

@pytest.fixture(scope="module")
def evbench():
    return build.build(events.HARNESS)


def test_harnesses_build_with_warnings_as_errors_only_in_tests(monkeypatch):
    assert "-Werror" in build.cflags()          # conftest sets PROXYTUNE_WERROR=1
    monkeypatch.delenv("PROXYTUNE_WERROR")
    assert "-Werror" not in build.cflags() and {"-Wall", "-Wextra"} <= set(build.cflags())
    monkeypatch.setenv("PROXYTUNE_WERROR", "1")
    for harness in measurements.harnesses():
        exe = build.build(harness)
        assert exe.exists() and exe.stat().st_mode & 0o111
        assert build.build(harness) == exe        # cached: same binary, not rebuilt


def test_list_reports_unavailable_mechanisms_with_a_reason(evbench):
    listing = {b["name"]: b for b in run_json([evbench, "--mode", "list"])["backends"]}
    assert set(listing) == {"select", "poll", "epoll", "io_uring", "io_uring-multishot", "kqueue"}
    for name in ("select", "poll", "epoll"):
        assert listing[name]["available"], listing[name]
    kq = listing["kqueue"]
    assert not kq["available"] and "kqueue" in kq["reason"] and "BSD" in kq["reason"]
    doc = run_json([evbench, "--mode", "idle", "--backend", "kqueue", "--n", "10"])
    assert doc["available"] is False and doc["reason"] == kq["reason"]


def test_multishot_refuses_hot_mode_instead_of_faking_it(evbench):
    doc = run_json([evbench, "--mode", "idle", "--backend", "io_uring-multishot", "--ready", "hot", "--n", "10"])
    assert doc["available"] is False and "edge-triggered" in doc["reason"]


def available_names(evbench):
    return [b["name"] for b in run_json([evbench, "--mode", "list"])["backends"] if b["available"]]


@pytest.mark.parametrize("ready", ["hot", "cold"])
def test_every_wait_returns_the_ready_descriptors(evbench, ready):
    for be in available_names(evbench):
        if be == "io_uring-multishot" and ready == "hot":
            continue
        doc = run_json([evbench, "--mode", "idle", "--backend", be, "--n", "300", "--k", "10", "--ready", ready,
                        "--calls", "50", "--reps", "2", "--warmup", "5"])
        assert doc["wrong_counts"] == 0, be
        assert all(r["events_per_call"] == 10 for r in doc["reps"]), be


def test_cold_counts_are_exact_beyond_the_io_uring_ring_size(evbench):
    """More descriptors than ring entries (4096): registration submits early, and no stale
    completion may be reported in cold mode (regression: 3210 wrong counts in a full sweep)."""
    for be in ("io_uring", "io_uring-multishot", "epoll"):
        if be not in available_names(evbench):
            continue
        doc = run_json([evbench, "--mode", "idle", "--backend", be, "--n", "5000", "--k", "100", "--ready", "cold",
                        "--calls", "200", "--reps", "2", "--warmup", "10"])
        assert doc["wrong_counts"] == 0, be


def scan_cost(evbench, backend, n):
    argv = [evbench, "--mode", "idle", "--backend", backend, "--n", n, "--k", 1, "--calls",
            events.calls_for(backend, n) // 4 + 20, "--reps", 5, "--warmup", 10]
    return stats.summary([r["ns_per_call"] for r in run_json(argv)["reps"]])["median"]


def test_poll_and_select_grow_with_idle_descriptors_epoll_stays_flat(evbench):
    names = available_names(evbench)
    ratio = {be: scan_cost(evbench, be, 5000) / scan_cost(evbench, be, 50)
             for be in ("select", "poll", "epoll", "io_uring") if be in names}
    # 100x more idle descriptors: the O(N) scans grow a lot (measured ~100x), O(ready) ones barely
    assert ratio["poll"] > 15 and ratio["select"] > 15, ratio
    assert ratio["epoll"] < 3, ratio
    if "io_uring" in ratio:
        assert ratio["io_uring"] < 3, ratio


def test_churn_select_poll_pay_at_the_next_wait_epoll_at_registration(evbench):
    doc = {be: run_json([evbench, "--mode", "churn", "--backend", be, "--n", "2000", "--calls", "300",
                         "--reps", "3", "--warmup", "20"])["reps"] for be in ("poll", "epoll")}
    med = lambda be, key: stats.summary([r[key] for r in doc[be]])["median"]
    assert med("poll", "ns_per_request") < med("epoll", "ns_per_request")           # a slot in an array vs 2 syscalls
    assert med("poll", "ns_per_request_with_wait") > 5 * med("epoll", "ns_per_request_with_wait")


def test_batching_more_events_per_call_under_overload(evbench):
    per_call = []
    for rate in (2000, 80000):
        doc = run_json([evbench, "--mode", "load", "--backend", "epoll", "--n", "200", "--rate", rate,
                        "--duration-ms", "200", "--work-us", "20", "--reps", "1"])
        r = doc["reps"][0]
        assert r["events"] > 0
        per_call.append(r["events_per_call"])
    assert per_call[0] < 2 and per_call[1] > 3 * per_call[0], per_call


def test_libevent_mode_fires_every_write(evbench):
    doc = run_json([evbench, "--mode", "libevent", "--backend", "poll", "-n", "100", "-a", "1", "-w", "100",
                    "--reps", "2"])
    assert [r["fired"] for r in doc["reps"]] == [101, 101]


def test_nofile_cap_is_reported(evbench):
    doc = run_json([evbench, "--mode", "idle", "--backend", "epoll", "--n", "1000000", "--calls", "10", "--reps", "1",
                    "--warmup", "1"])
    assert doc["nofile"]["capped"] is True
    assert doc["params"]["n"] < 1000000 and doc["params"]["n_requested"] == 1000000
    assert doc["params"]["n"] * 2 <= doc["nofile"]["raised_to"]


def test_events_quick_result_validates(tmp_path):
    r = events.run(quick=True, backends=["poll", "epoll", "kqueue"], quiet=True)
    doc = envelope("bench", r)
    validate(json.loads(json.dumps(doc)))
    assert r["scaling"]["poll"]["ratio"] > 15 and r["scaling"]["epoll"]["ratio"] < 3
    assert any(not b["available"] for b in r["backends"])


@pytest.mark.skipif(shutil.which("valgrind") is None and not perf_counts("L1-dcache-load-misses").ok,
                    reason="no way to count D1 misses: neither hardware counters nor valgrind")
def test_fdscan_mogul_variants():
    r = fdscan.run(quick=True, quiet=True)
    validate(envelope("bench", r))
    m = {x["variant"]: x["d1_misses_per_call"] for x in r["misses"]}
    # three cache lines per entry against 24-byte entries: ~8x in theory and in cachegrind
    assert m[1] > 4 * m[3], m
    assert m[2] > m[3] and m[3] > m[5], m
    at = {p["variant"]: p["ns_per_call"]["median"] for p in r["points"] if p["n"] == 10000}
    assert min(at, key=at.get) == 5 and at[1] > 10 * at[5], at


def test_stats_fit_recovers_a_known_line():
    pts = [(n, k, 100 + 2.5 * n + 7 * k) for n in (10, 100, 1000) for k in (1, 10)]
    f = stats.fit_model(pts)
    assert abs(f["b_ns_per_fd"] - 2.5) < 1e-6 and abs(f["c_ns_per_ready"] - 7) < 1e-6
    s = stats.summary([5, 1, 3, 2, 4])
    assert s["median"] == 3 and s["min"] == 1 and s["ci95"][0] <= 3 <= s["ci95"][1]
    k = stats.knee([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 14, 24, 34, 44])
    assert k["n"] == 4 and k["slope_above_ns"] > 5 * k["slope_below_ns"]


def test_bench_cli_help_and_json(cli, tmp_path):
    assert cli("bench", "events", "--help").exit_code == 0
    r = cli("bench", "fdscan", "--quick", "--json", "-o", str(tmp_path / "f.json"))
    assert r.exit_code == 0
    validate(json.loads(r.output))
    assert json.loads((tmp_path / "f.json").read_text())["data"]["bench"] == "fdscan"


def test_a_harness_error_prints_one_parseable_error_document(evbench):
    """The result is written only when complete: a failure prints one JSON error document."""
    import json
    import subprocess
    p = subprocess.run([str(evbench), "--mode", "idle", "--backend", "epoll", "--n", "10", "--pin", "100000"],
                       capture_output=True, text=True, timeout=60)
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["harness"] == "evbench" and "sched_setaffinity" in doc["error"]

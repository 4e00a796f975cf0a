"""The report's conclusions: seed verdicts and the ranked summary are computed from
the run's own data (a measured result from docs/results, and variations of it), never typed in."""

import copy
import json
import os
import shutil
from pathlib import Path

import pytest

from proxytune.reports import seeds, summary

REPO = Path(__file__).resolve().parent.parent
MEASURED = json.loads((REPO / "docs/results/report-with-proxy.json").read_text())["data"]["sections"]


@pytest.mark.parametrize("today, original, expected", [
    (None, 2.0, "not measurable here"), (float("nan"), 2.0, "not measurable here"),
    (0.5, 2.0, "reversed"), (1.05, 2.0, "shrank"), (1.2, 2.0, "shrank"), (1.5, 2.0, "holds"),
    (3.9, 2.0, "holds"), (4.1, 2.0, "grew"), (0.95, 1.53, "shrank"), (209.7, 78.9, "holds"), (7000, 78.9, "grew")])
def test_verdict_rules(today, original, expected):
    assert seeds.verdict(today, original)[0] == expected


def test_every_seed_has_a_row_with_a_verdict_and_a_reason():
    rows = seeds.rows(MEASURED)
    assert [r["seed"] for r in rows] == ["select/poll O(N)", "Mogul's comm_select fix", "kqueue",
                                          "large file vs file per object", "noatime", "Cooper's host settings",
                                          "CPU per request split"]
    for r in rows:
        assert r["verdict"] in ("holds", "grew", "shrank", "reversed", "not measurable here")
        assert r["reason"] and "\n" not in r["reason"]


def test_ratios_are_the_measured_ones():
    by = {r["seed"]: r for r in seeds.rows(MEASURED)}
    assert by["select/poll O(N)"]["ratio"] == pytest.approx(MEASURED["events"]["scaling"]["poll"]["ratio"], rel=1e-3)
    n = max(p["n"] for p in MEASURED["fdscan"]["points"])
    v = {p["variant"]: p["ns_per_call"]["median"] for p in MEASURED["fdscan"]["points"] if p["n"] == n}
    assert by["Mogul's comm_select fix"]["ratio"] == pytest.approx(v[1] / v[5], rel=1e-3)
    gains = sorted(e["gain"] + 1 for e in MEASURED["storage"]["noatime_effect"].values())
    assert by["noatime"]["ratio"] == pytest.approx(gains[len(gains) // 2], rel=1e-3)


def test_kqueue_on_linux_is_not_measurable_and_shows_epoll_in_its_place():
    row = seeds.rows(MEASURED)[2]
    assert row["verdict"] == "not measurable here" and "kqueue" in row["reason"]
    assert "epoll" in row["today"]


def test_a_slower_large_file_store_is_reported_reversed():
    data = copy.deepcopy(MEASURED)
    for c in data["storage"]["combos"]:
        if c["store"] == "largefile" and c["available"]:
            c["steady_objects_per_s"] /= 20
    assert seeds.largefile(data["storage"])["verdict"] == "reversed"


def test_engines_on_both_sides_of_a_boundary_make_the_row_say_uncertain():
    data = copy.deepcopy(MEASURED)
    effects = data["storage"]["noatime_effect"]
    for key, gain in zip(sorted(effects), (0.15, 0.38, 0.40)):       # x1.15 shrank, x1.38 and x1.40 hold
        effects[key]["gain"] = gain
    r = seeds.noatime(data["storage"])
    assert r["verdict"] == "holds" and "uncertain: the engines range x1.15 to x1.40, which reads shrank to holds" \
        in r["reason"], r["reason"]
    for key in effects:
        effects[key]["gain"] = 0.40
    assert "uncertain" not in seeds.noatime(data["storage"])["reason"]


def test_missing_sections_are_not_measurable_with_the_reason():
    rows = seeds.rows({})
    assert {r["verdict"] for r in rows} == {"not measurable here"}
    assert "bench storage did not run" in rows[3]["reason"]


def test_cooper_and_cpu_split_from_a_before_after_run_and_a_doctor_result():
    px = {"compare_profile": "linux/squid", "stores": [
        {"steady": {"rps": 2802.0}, "error_count": 381}, {"steady": {"rps": 4563.0}, "error_count": 7}]}
    row = seeds.cooper(px)
    assert row["ratio"] == pytest.approx(4563 / 2802, rel=1e-3) and row["verdict"] == "holds"
    doc = {"evidence": {"loop": {"cpu_split": {"kernel": 0.7, "proxy": 0.2, "shared library": 0.1}}}}
    assert seeds.cpu_split(doc)["verdict"] == "holds"
    doc["evidence"]["loop"]["cpu_split"] = {"kernel": 0.1, "proxy": 0.8}
    assert seeds.cpu_split(doc)["verdict"] == "reversed"


def test_summary_ranks_findings_then_drift_then_bench_choices_each_with_a_command():
    data = copy.deepcopy(MEASURED)
    data["doctor"] = {"findings": [{"id": "fd-exhaustion", "severity": "high", "title": "out of fds",
                                    "evidence": {"emfile_per_s": 9}, "fix": "raise LimitNOFILE", "impact": 1.0}]}
    items = summary.build(data)
    assert [i["source"] for i in items] == ["doctor", "audit", "bench events", "bench storage"]
    assert [i["rank"] for i in items] == [1, 2, 3, 4]
    assert all(i["command"] for i in items)
    assert "tune apply" in items[1]["command"]


def test_summary_is_empty_when_everything_is_met_and_nothing_was_benched():
    audit = copy.deepcopy(MEASURED["audit"])
    for r in audit["settings"]:
        r["status"] = "met"
    assert summary.build({"audit": audit}) == []


def test_every_table_of_measurements_states_its_spread():
    """Medians come with the worst IQR/median of their row, stores with max/min over repetitions."""
    from proxytune.reports import tables
    assert tables.spread([{"iqr_rel": 0.05}, {"iqr_rel": 0.26}, {"median": 3}]) == "26%"
    assert tables.spread([{"median": 3}]) == "-"
    key = {"fs": "ext4", "atime": "noatime", "store": "ufs", "engine": "sync"}
    runs = [{**key, "fill": {"objects_per_s": 100.0}, "steady": {"objects_per_s": 10.0}},
            {**key, "fill": {"objects_per_s": 150.0}, "steady": None},
            {**key, "engine": "threads", "fill": {"objects_per_s": 999.0}, "steady": None}]
    assert tables.rep_spread(runs, key) == "x1.50 · one run"
    events = json.loads((REPO / "docs/results/events-full.json").read_text())["data"]
    t = tables.events_section(events).tables[0]
    assert t.headers[-1] == tables.SPREAD and all(r[-1].endswith("%") for r in t.rows)


@pytest.mark.skipif(not (os.geteuid() == 0 and shutil.which("wrk") and shutil.which("perf") and shutil.which("bpftrace")
                         and Path("/usr/sbin/nginx").exists()), reason="needs root, nginx, wrk, perf and bpftrace")
def test_report_with_proxy_splits_the_cpu_of_a_proxy_it_starts_itself():
    """The CPU-split seed from the report's own nginx under load, not from a proxy the host runs."""
    from proxytune.probes import selfload
    dirs = lambda: set(Path("/tmp").glob("proxytune-nginx-*"))
    before = dirs()
    d = selfload.cpu_split_on_nginx(seconds=3)
    split = d["evidence"]["loop"]["cpu_split"]
    assert abs(sum(split.values()) - 1) < 0.02 and split["kernel"] > 0 and split["proxy"] > 0, split
    row = seeds.cpu_split(d)
    assert row["verdict"] in ("holds", "grew", "shrank", "reversed") and row["today"].startswith("nginx (1 worker")
    assert not dirs() - before                                  # its nginx and temp dir are gone


def _events_at(epoll: tuple[float, float], uring: tuple[float, float]) -> dict:
    """The measured events section with epoll's and io_uring's cost at the largest N replaced by
    (median, relative spread) each: everything else as measured."""
    ev = copy.deepcopy(MEASURED["events"])
    n = ev["scaling"]["poll"]["n_large"]
    for p in ev["idle"]:
        if p["n"] == n and p["k"] == 1 and p["ready"] == "hot" and p["backend"] in ("epoll", "io_uring"):
            med, rel = epoll if p["backend"] == "epoll" else uring
            p["available"] = True
            p["ns_per_call"] = {"median": med, "iqr_rel": rel, "ci95": [med * (1 - rel / 2), med * (1 + rel / 2)]}
    return ev


@pytest.mark.parametrize("epoll, uring, said", [
    ((500, 0.05), (480, 0.05), "epoll or io_uring: within noise here"),      # 4% apart, spreads overlap
    ((480, 0.05), (500, 0.05), "epoll or io_uring: within noise here"),
    ((500, 0.02), (250, 0.02), "cheaper still, but no proxy here waits for events with it"),
    ((250, 0.02), (500, 0.02), None)])
def test_the_event_action_names_the_mechanism_its_fix_uses(epoll, uring, said):
    """The fix the proxies offer is epoll: the action never names io_uring as what to run on, and says when
    io_uring was within noise of it (the report once said "run on io_uring" with the fix "use epoll")."""
    item = summary.from_events(_events_at(epoll, uring))[0]
    assert item["what"].startswith("run the proxy on epoll, not select/poll")
    assert "epoll" in item["command"] and "io_uring" not in item["command"]
    text = item["what"] + " " + item["why"]
    if said:
        assert said in text
    else:
        assert "within noise" not in text and "cheaper still" not in text

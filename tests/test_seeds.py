"""The report's conclusions: seed verdicts and the ranked summary are computed from
the run's own data (a measured result from docs/results, and variations of it), never typed in."""

import copy
import json
import math
import os
import shutil
from pathlib import Path

import pytest

from proxytune.microbench import storage
from proxytune.reports import seeds, summary

REPO = Path(__file__).resolve().parent.parent
MEASURED = json.loads((REPO / "docs/results/report-with-proxy.json").read_text())["data"]["sections"]


def _rounds(st: dict, scale: dict | None = None, rounds=(1.0, 1.03, 0.98, 1.01, 0.99)) -> dict:
    """The measured storage section with its seed cells repeated as rounds (the measured run times
    each factor, so the pairs' ratios spread a little), `scale`: (atime, store) -> factor on objects/s;
    seed_pairs derived again from the runs, as bench storage does."""
    st = copy.deepcopy(st)
    seed = [r for r in st["runs"] if r["engine"] == storage.SEED_ENGINE and r["fs"] == "ext4"]
    st["runs"] = []
    for i, f in enumerate(rounds):
        for r in seed:
            r = copy.deepcopy(r)
            r["rep"] = i
            k = f * (scale or {}).get((r["atime"], r["store"]), 1.0) if r["store"] == "largefile" or \
                r["atime"] == "noatime" else 1.0
            for phase in ("steady", "hit"):
                if r.get(phase) and r[phase].get("objects_per_s"):
                    r[phase]["objects_per_s"] *= k
            st["runs"].append(r)
    st["seed_pairs"] = storage.seed_pairs(st["runs"])
    return st


def test_every_seed_has_a_row_with_a_verdict_and_a_reason():
    rows = seeds.rows(MEASURED)
    assert [r["seed"] for r in rows] == ["select/poll O(N)", "Mogul's comm_select fix", "kqueue",
                                          "large file vs file per object", "noatime", "Cooper's host settings",
                                          "CPU per request split"]
    for r in rows:
        assert r["verdict"] in ("holds", "grew", "shrank", "reversed", "inconclusive here", "not measurable here")
        assert r["reason"] and "\n" not in r["reason"]
        assert r["verdict"] == "not measurable here" or r["cells"]


def test_ratios_are_the_measured_ones():
    by = {r["seed"]: r for r in seeds.rows(MEASURED)}
    assert by["select/poll O(N)"]["ratio"] == pytest.approx(MEASURED["events"]["scaling"]["poll"]["ratio"], rel=1e-3)
    n = max(p["n"] for p in MEASURED["fdscan"]["points"])
    v = {p["variant"]: p["ns_per_call"]["median"] for p in MEASURED["fdscan"]["points"] if p["n"] == n}
    assert by["Mogul's comm_select fix"]["ratio"] == pytest.approx(v[1] / v[5], rel=1e-3)
    st = _rounds(MEASURED["storage"])
    pairs = st["seed_pairs"]["noatime"]            # a result from before flushes were counted: its hits/s
    assert seeds.noatime(st)["ratio"] == pytest.approx(sorted(pairs["ratios"])[2], rel=1e-3)
    assert seeds.noatime(st)["reason"].startswith("x") and "judged by hits/s" in seeds.noatime(st)["reason"]
    assert len(pairs["ratios"]) == 5 and pairs["a"] == "relatime ufs" and pairs["b"] == "noatime ufs"
    st = _with_work(st, (1.0,) * 5, sectors=(1.0,) * 5)
    rel, noa = (_hit(st, atime)["device_io"] for atime in ("relatime", "noatime"))
    work = max((rel["read_ios"] + rel["write_ios"] + rel["flush_ios"])
               / (noa["read_ios"] + noa["write_ios"] + noa["flush_ios"]),
               (rel["read_sectors"] + rel["write_sectors"]) / (noa["read_sectors"] + noa["write_sectors"]))
    assert seeds.noatime(st)["ratio"] == pytest.approx(work, rel=1e-3)          # the device's, not hits/s
    assert f"x{sorted(st['seed_pairs']['noatime']['ratios'])[2]:.2f}" in seeds.noatime(st)["reason"]


def _hit(st: dict, atime: str) -> dict:
    """The first seed round's hit phase of this atime mode."""
    return [x for x in st["runs"] if (x["fs"], x["engine"], x["atime"], x["store"]) ==
            ("ext4", storage.SEED_ENGINE, atime, "ufs")][0]["hit"]


def _with_work(st: dict, works, speeds=None, sectors=None) -> dict:
    """st's seed rounds with relatime's device operations `works[i]` x noatime's in round i (its sectors
    `sectors[i]` x, else the same factor; a round's factor None: that round has no counts on relatime's
    side) and noatime's hits/s `speeds[i]` x relatime's; seed_pairs derived again."""
    st = copy.deepcopy(st)
    for r in st["runs"]:
        if r.get("hit") and "flush_ios" not in (r["hit"].get("device_io") or {"flush_ios": 0}):
            r["hit"]["device_io"]["flush_ios"] = 1                 # counted since 2026-11-28
    for r in st["runs"]:
        if r["fs"] == "ext4" and r["engine"] == storage.SEED_ENGINE and r["store"] == "ufs" and r.get("hit"):
            other = [x for x in st["runs"] if x["rep"] == r["rep"] and x["store"] == "ufs" and x.get("hit")
                     and x["atime"] != r["atime"] and x["fs"] == "ext4" and x["engine"] == r["engine"]][0]
            ops, sec = works[r["rep"]], (sectors or works)[r["rep"]]
            if r["atime"] == "relatime" and ops is None:
                r["hit"].pop("device_io", None)
            elif r["atime"] == "relatime":
                r["hit"]["device_io"] = {k: v * (sec if "sectors" in k else ops)
                                         for k, v in other["hit"]["device_io"].items()}
            elif speeds:
                r["hit"]["objects_per_s"] = other["hit"]["objects_per_s"] * speeds[r["rep"]]
    st["seed_pairs"] = storage.seed_pairs(st["runs"])
    return st


def test_noatime_is_judged_by_the_device_work_it_saves_not_by_a_cpu_bound_hits_per_s():
    st = _rounds(MEASURED["storage"])
    # the work ratio decides, whatever hits/s do: the pairs' hits/s here span reversed to holds
    r = seeds.noatime(_with_work(st, (1.04, 1.05, 1.03, 1.045, 1.04), speeds=(0.72, 1.28, 1.0, 0.9, 1.1)))
    assert r["verdict"] == "shrank" and r["interval"] == [1.03, 1.05], r
    assert "x1.00 (x0.72 to x1.28) follow this host's CPU" in r["reason"], r
    assert seeds.noatime(_with_work(st, (1.4, 1.5, 1.45, 1.6, 1.5)))["verdict"] == "holds"
    edge = seeds.noatime(_with_work(st, (1.2, 1.25, 1.22, 1.21, 1.2)))            # 1.53 ** 0.5 = 1.237
    assert edge["verdict"] == "inconclusive here" and "spans shrank to holds" in edge["reason"], edge
    three = _rounds(MEASURED["storage"], rounds=(1.0, 1.0, 1.0))
    assert seeds.noatime(_with_work(three, (1.05, 1.04, 1.03)))["verdict"] == "inconclusive here"
    # the larger of operations and sectors, pair by pair: sectors here
    r = seeds.noatime(_with_work(st, (1.01,) * 5, sectors=(1.4, 1.45, 1.4, 1.5, 1.4)))
    assert r["verdict"] == "holds" and r["ratio"] == pytest.approx(1.4, rel=1e-3), r
    r = seeds.noatime(_with_work(st, (1.4, 1.45, 1.4, 1.5, 1.4), sectors=(1.01,) * 5))
    assert r["verdict"] == "holds" and r["ratio"] == pytest.approx(1.4, rel=1e-3), r


def test_noatime_pairs_only_the_rounds_with_counts_and_no_count_is_no_ratio():
    st = _rounds(MEASURED["storage"])
    r = seeds.noatime(_with_work(st, (1.04, None, 1.05, 1.04, 1.04)))        # a round without counts
    assert r["reps"] == 4 and r["verdict"] == "inconclusive here" and "(4 pairs with counts)" in r["reason"], r
    assert seeds.noatime(_with_work(st, (None,) * 5))["reason"].startswith("x")      # none: its hits/s
    assert "judged by hits/s" in seeds.noatime(_with_work(st, (None,) * 5))["reason"]
    zero = {"ops_per_object": 0.0, "sectors_per_object": 0.0}
    some = {"ops_per_object": 0.2, "sectors_per_object": 3.0}
    assert seeds._work_ratio(zero, zero) == 1.0                       # neither moved: even
    assert math.isnan(seeds._work_ratio(some, zero))                  # no ratio: the pair is left out
    p = _with_work(st, (1.04,) * 5)
    p["seed_pairs"]["noatime"]["b_device"][0] = dict(zero)
    r = seeds.noatime(p)
    assert r["reps"] == 4 and "Infinity" not in json.dumps(r), r


def test_disk_stat_reads_flushes_where_the_kernel_counts_them(tmp_path, monkeypatch):
    fields = "10 0 200 5 20 0 400 7 0 9 12 0 0 0 0 3 1"
    (tmp_path / "loop9").mkdir()
    (tmp_path / "loop9" / "stat").write_text(fields + "\n")
    real = storage.Path
    monkeypatch.setattr(storage, "Path", lambda p: tmp_path if p == "/sys/block" else real(p))
    assert storage.disk_stat("/dev/loop9") == {"read_ios": 10, "read_sectors": 200, "write_ios": 20,
                                               "write_sectors": 400, "flush_ios": 3}
    (tmp_path / "loop9" / "stat").write_text(" ".join(fields.split()[:11]) + "\n")       # before 5.5
    assert storage.disk_stat("/dev/loop9")["flush_ios"] == 0


def test_a_noatime_result_without_device_counts_is_judged_by_its_hits_per_s():
    st = _rounds(MEASURED["storage"])
    for r in st["runs"]:
        if r.get("hit"):
            r["hit"].pop("device_io", None)
    st["seed_pairs"] = storage.seed_pairs(st["runs"])
    assert "a_device" not in st["seed_pairs"]["noatime"]
    assert seeds.noatime(st)["ratio"] == pytest.approx(sorted(st["seed_pairs"]["noatime"]["ratios"])[2], rel=1e-3)


def test_kqueue_on_linux_is_not_measurable_and_shows_epoll_in_its_place():
    row = seeds.rows(MEASURED)[2]
    assert row["verdict"] == "not measurable here" and "kqueue" in row["reason"]
    assert "epoll" in row["today"]


def test_a_slower_large_file_store_is_reported_reversed_over_five_rounds():
    r = seeds.largefile(_rounds(MEASURED["storage"], {("relatime", "largefile"): 1 / 200}))
    assert r["verdict"] == "reversed" and r["reps"] == 5 and "5 rounds alternating" in r["cells"], r
    r = seeds.largefile(_rounds(MEASURED["storage"], {("relatime", "largefile"): 1 / 200}, rounds=(1.0, 1.03, 0.98)))
    assert r["verdict"] == "inconclusive here" and "a verdict takes 5 at least" in r["reason"], r


def test_rounds_across_an_edge_are_inconclusive_and_one_round_is_too_few():
    st = {k: v for k, v in MEASURED["storage"].items()}
    st["runs"] = copy.deepcopy(st["runs"])
    for r in st["runs"]:                    # hits/s alone (a saved result without device counts)
        if r.get("hit"):
            r["hit"].pop("device_io", None)
    rel, noa = (_hit(st, atime)["objects_per_s"] for atime in ("relatime", "noatime"))
    to = lambda ratio: ratio * rel / noa                  # the factor that makes noatime / relatime this ratio
    r = seeds.noatime(_rounds(st, {("noatime", "ufs"): to(1.2)}, rounds=(1.0, 1.0 * 1.25 / 1.2, 1.1 / 1.2, 1.0, 1.0)))
    assert r["verdict"] == "inconclusive here" and "spans shrank to holds" in r["reason"], r    # 1.237 is the edge
    r = seeds.noatime(_rounds(st, {("noatime", "ufs"): to(1.6)}, rounds=(1.0,)))
    assert r["verdict"] == "inconclusive here" and "a verdict takes 5 at least" in r["reason"]


def test_missing_sections_are_not_measurable_with_the_reason():
    rows = seeds.rows({})
    assert {r["verdict"] for r in rows} == {"not measurable here"}
    assert "bench storage did not run" in rows[3]["reason"]


def test_cooper_and_cpu_split_from_a_before_after_run_and_a_doctor_result():
    px = {"compare_profile": "linux/squid", "stores": [
        {"steady": {"rps": 2802.0}, "error_count": 381}, {"steady": {"rps": 4563.0}, "error_count": 7}]}
    row = seeds.cooper(px)
    assert row["ratio"] == pytest.approx(4563 / 2802, rel=1e-3) and row["verdict"] == "inconclusive here"
    assert "over 1 pair): a verdict takes 5 at least" in row["reason"]
    doc = {"evidence": {"loop": {"cpu_split": {"kernel": 0.7, "proxy": 0.2, "shared library": 0.1}}}}
    row = seeds.cpu_split(doc)
    assert row["ratio"] == pytest.approx(3.5) and row["verdict"] == "inconclusive here"


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
    assert row["ratio"] > 0 and row["today"].startswith("nginx (1 worker")
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


def _run(label: str, rps: float, http_errors: int, idle_failed: int, p50_ms: float) -> dict:
    """One Squid run of the Cooper rounds as bench proxy records it: 3 s steady, 400 busy, 1000 idle."""
    return {"label": label, "steady": {"requests": int(rps * 3), "rps": rps, "http_errors": http_errors,
                                       "errors": {"connect": 0, "read": 0, "write": 0, "timeout": 0, "status": http_errors},
                                       "latency_us": {"p50": p50_ms * 1000, "p99": p50_ms * 4000}},
            "errors": {"idle_clients_failed": {"refused": idle_failed}, "idle_clients_dropped": 0}}


def test_cooper_credits_a_run_only_the_share_of_clients_it_served():
    from proxytune.microbench import hostsettings
    plan = {"concurrency": 400, "idle": 1000}
    before = hostsettings.capacity(_run("before", 2400.0, 0, 700, 17.6), plan)
    after = hostsettings.capacity(_run("after", 1800.0, 0, 0, 150.0), plan)
    assert before["served_share"] == pytest.approx(700 / 1400) and after["served_share"] == 1.0
    assert before["goodput_rps"] == pytest.approx(2400) and before["served_goodput_rps"] == pytest.approx(2400 * 0.3)
    failing = hostsettings.capacity(_run("x", 1000.0, 600, 0, 5.0), plan)
    assert failing["goodput_rps"] == pytest.approx(800) and failing["busy_answered_share"] == pytest.approx(0.8)
    stores = []
    for i, (b, a) in enumerate([(2400, 1800), (2300, 1900), (2500, 1700), (2400, 1800), (2400, 1800)]):
        pair = [_run("before", b, 0, 700, 17.6), _run("after", a, 0, 0, 150.0)]
        for s in pair:
            s["capacity"] = hostsettings.capacity(s, plan)
        stores += pair if i % 2 == 0 else pair[::-1]
    rounds = [{"before": 0, "after": 1}, {"before": 3, "after": 2}, {"before": 4, "after": 5},
              {"before": 7, "after": 6}, {"before": 8, "after": 9}]
    px = {"compare_profile": "linux/squid", "stores": stores, "rounds": rounds, "cpus": {"squid": "0", "load": [1]}}
    row = seeds.cooper(px)
    # served goodput, goodput x the idle clients held (30 % before): 1800/720, 1900/690, 1700/750
    assert row["ratio"] == pytest.approx(2.5) and row["interval"] == [pytest.approx(1700 / 750, abs=1e-3),
                                                                      pytest.approx(1900 / 690, abs=1e-3)]
    assert row["verdict"] == "holds" and row["reps"] == 5
    assert "clients served 50% -> 100% of 1,400" in row["today"] and "p50 17.6 -> 150.0 ms" in row["today"]
    assert "squid on CPU 0, the load on 1" in row["cells"]


def test_the_cpu_split_of_each_run_of_the_pairs_is_a_window():
    view = lambda k, p: {"proxy": "squid", "evidence": {"loop": {"cpu_split": {"kernel": k, "proxy": p}}}}
    splits = [(0.7, 0.2), (0.72, 0.18), (0.69, 0.21), (0.71, 0.2), (0.7, 0.19), (0.68, 0.2)]
    doc = {**view(0.7, 0.2), "repeats": [{**view(k, p), "label": "before" if i in (0, 3, 4) else "after"}
                                         for i, (k, p) in enumerate(splits)]}
    row = seeds.cpu_split(doc)
    assert row["reason"].endswith("; before x3.50-3.68, after x3.29-4.00"), row["reason"]
    assert row["reps"] == 6 and row["ratio"] == pytest.approx((3.5 + 3.55) / 2) and row["verdict"] == "holds", row
    assert "6 perf window(s) on the proxy, one per run of the pairs" == row["cells"]
    assert seeds.cpu_split({**doc, "repeats": doc["repeats"][:3]})["verdict"] == "inconclusive here"


def test_a_cpu_split_whose_sides_sit_in_different_ranges_says_so_instead_of_asking_for_more_windows():
    """Shrank below x4.3 ** 0.5 = x2.07, holds above: a side wholly on each side of that edge."""
    view = lambda k, p, side: {"label": side, "evidence": {"loop": {"cpu_split": {"kernel": k, "proxy": p}}}}
    before = [view(0.7, 0.26, "before"), view(0.69, 0.27, "before"), view(0.71, 0.26, "before")]   # x2.6-2.7
    after = [view(0.5, 0.45, "after"), view(0.55, 0.42, "after"), view(0.5, 0.38, "after")]      # x1.1-1.3
    row = seeds.cpu_split({"proxy": "squid", "repeats": [before[0], after[0], after[1], before[1], before[2], after[2]]})
    assert row["verdict"] == "inconclusive here" and "(before: holds, after: shrank)" in row["reason"], row
    assert "more windows would not join them" in row["reason"] and "over 6 windows" in row["reason"], row
    # one side straddling the edge (x2.0 and x2.7): no such claim, the interval's own rule speaks
    mixed = [view(0.6, 0.3, "before")] + before[1:]
    row = seeds.cpu_split({"proxy": "squid", "repeats": [mixed[0], after[0], after[1], mixed[1], mixed[2], after[2]]})
    assert row["verdict"] == "inconclusive here" and "spans shrank to holds" in row["reason"], row
    # both sides in one range: a verdict
    row = seeds.cpu_split({"proxy": "squid", "repeats": before + [view(0.7, 0.25, "after")] * 3})
    assert row["verdict"] == "holds", row


def test_a_storage_result_from_before_the_seed_rounds_says_so():
    r = seeds.largefile(MEASURED["storage"])                     # a saved result (--from) with no seed_pairs
    assert r["verdict"] == "not measurable here" and "predates the seed rounds" in r["reason"]
    assert "ran without the seed rows' cells" in seeds.noatime({**MEASURED["storage"], "seed_pairs": {}})["reason"]


def test_the_cpu_split_row_reads_every_window_even_when_the_first_has_none():
    view = lambda k, p: {"evidence": {"loop": {"cpu_split": {"kernel": k, "proxy": p}} if p else {}}}
    doc = {**view(0, 0), "repeats": [view(0, 0), view(0.7, 0.2), view(0.72, 0.18)]}
    row = seeds.cpu_split(doc)
    assert row["reps"] == 2 and row["verdict"] == "inconclusive here" and "2 windows" in row["reason"]

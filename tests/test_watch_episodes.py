"""Episodes from window records, and the worst window rendered as the doctor printed it.

Windows are built by the real code path: the doctor's answers the live matrix recorded from real
proxies (tests/evidence/owncap), their rules replayed (findings.evaluate, proxies_findings.refine),
turned into records by windows.watched() and stored through the recorder."""

import copy
import json
import matrix
from proxytune.probes import episodes, findings, proxies_findings, recorder, windows

BUSY = "haproxy-busy-global50-stats"       # haproxy at its maxconn: finding haproxy-maxconn
HEALTHY = "haproxy-healthy"
NGINX = "nginx-busy-wc128x1-nostatus"      # nginx-worker-connections


def answer(cell: str) -> dict:
    """The doctor's answer for a recorded cell, its rules run again on its evidence."""
    data = json.loads((matrix.EVIDENCE / f"{cell}.json").read_text())["data"]
    ev = data["evidence"]
    found = proxies_findings.refine(findings.evaluate(ev), ev)
    return {**data, "findings": [f.to_json() for f in found]}


def window(cell: str, seq: int, run: str = "r1", t0: float = 1_800_000_000.0, scale: float = 1.0) -> dict:
    r = copy.deepcopy(answer(cell))
    for f in r["findings"]:
        f["impact"] = f.get("impact", 0) * scale
    start = t0 + 10 * seq
    return windows.watched(run, seq, start, start + 10, r, "haproxy")


def test_the_recorded_cells_have_the_findings_these_tests_rely_on():
    assert [f["id"] for f in answer(BUSY)["findings"]] == ["haproxy-maxconn"]
    assert answer(HEALTHY)["findings"] == []
    assert "nginx-worker-connections" in [f["id"] for f in answer(NGINX)["findings"]]


def test_consecutive_windows_with_one_finding_are_one_episode():
    recs = [window(HEALTHY, 0), window(BUSY, 1), window(BUSY, 2, scale=3), window(BUSY, 3), window(HEALTHY, 4),
            window(BUSY, 5), window(HEALTHY, 6)]
    eps = episodes.fold(recs)
    assert [(e["finding"], e["windows"]) for e in eps] == [("haproxy-maxconn", 3), ("haproxy-maxconn", 1)]
    first = eps[0]
    assert (first["start"], first["end"]) == (recs[1]["t0"], recs[3]["t1"])
    assert first["worst_window"]["seq"] == 2            # the most impact of the same severity
    assert first["peak_evidence"] == recs[2]["findings"][0]["evidence"]
    assert first["id"] == episodes.episode_id(recs[1]["t0"], "haproxy-maxconn") and not first["ongoing"]
    assert first["severity"] == "high" and first["fix"]


def test_a_gap_an_absent_window_or_a_new_run_ends_an_episode():
    gap = [window(BUSY, 0), window(BUSY, 2)]
    absent = [window(BUSY, 0), windows.unwatched("r1", 1, 0, 1, windows.ABSENT, "no haproxy running", "haproxy"),
              window(BUSY, 2)]
    rerun = [window(BUSY, 0), window(BUSY, 1, run="r2")]
    for recs in (gap, absent, rerun):
        assert [e["windows"] for e in episodes.fold(recs)] == [1, 1]


def test_two_findings_overlap_as_two_episodes_and_the_last_is_ongoing():
    recs = [window(BUSY, 0), window(NGINX, 1), window(NGINX, 2)]
    eps = episodes.fold(recs)
    assert sorted((e["finding"], e["windows"], e["ongoing"]) for e in eps) == sorted(
        [("haproxy-maxconn", 1, False)] + [(f["id"], 2, True) for f in recs[1]["findings"]])


def test_damaged_and_foreign_records_are_skipped():
    recs = [window(BUSY, 0), {"v": 99}, {"v": 1, "run": 3}, "junk", window(BUSY, 1)]
    assert [e["windows"] for e in episodes.fold(recs)] == [2]
    # this version's shape with values no window has: history printed a traceback for each
    odd = [dict(window(BUSY, 2), t0=1e20), dict(window(BUSY, 3), t1=float("nan")), dict(window(BUSY, 4), t0=True),
           dict(window(BUSY, 5), findings=[{"id": "x", "severity": None}]), dict(window(BUSY, 6), findings=["x"])]
    assert not any(windows.is_window(r) for r in odd)
    assert [e["windows"] for e in episodes.fold(recs + odd)] == [2]


def test_between_keeps_the_overlapping_episodes():
    eps = episodes.fold([window(BUSY, 0), window(HEALTHY, 1), window(BUSY, 6)])
    t = eps[1]["start"]
    assert episodes.between(eps, t, None) == [eps[1]]
    assert episodes.between(eps, None, t - 1) == [eps[0]]
    assert episodes.between(eps, None, None) == eps


def test_a_recorded_worst_window_renders_as_the_doctor_printed_it(tmp_path, capsys):
    from proxytune.probes import render
    from proxytune.reports import doctor_md
    with recorder.Recorder(tmp_path / "ring", 1 << 20) as r:
        for i, cell in enumerate([HEALTHY, BUSY, BUSY, HEALTHY]):
            assert r.append(window(cell, i, scale=i))
    ep = episodes.fold(recorder.read(tmp_path / "ring", whole=False).records)[0]
    assert "body" not in ep["worst"]                     # history reads heads only
    whole = recorder.load(tmp_path / "ring", ep["worst"]["_at"])
    live = answer(BUSY)
    render.doctor_report(windows.as_result(whole))
    again = capsys.readouterr().out
    render.doctor_report({**live, "findings": [dict(f, impact=f["impact"] * 2) for f in live["findings"]]})
    assert again == capsys.readouterr().out and "haproxy-maxconn" in again
    md = doctor_md.render(windows.as_result(whole), episodes.summary(ep))
    assert "haproxy-maxconn" in md and "**fix**" in md and "| what | used | limit | where |" in md

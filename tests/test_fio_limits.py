"""fio as each store's limit: the engine family and depth of the store it bounds, a fraction
only when the limit held, and job files that fio itself accepts and runs."""

import shutil

import pytest

from proxytune.microbench import fio


@pytest.mark.parametrize("engine, ioengine, depth, numjobs", [
    ("sync", "psync", 1, 1), ("threads", "psync", 1, 16), ("posix-aio", "posixaio", 16, 1),
    ("io_uring", "io_uring", 16, 1)])
def test_each_store_engine_gets_its_own_family_and_depth(engine, ioengine, depth, numjobs):
    jobs = fio.jobs("/x/fio.dat", 64, 200, 2, 0, "4k/100", engine)
    assert sorted(jobs) == sorted(fio.job_name(p, 0, engine) for p in fio.PATTERNS)
    for text in jobs.values():
        assert f"ioengine={ioengine}\n" in text and f"iodepth={depth}\n" in text and f"numjobs={numjobs}\n" in text
        assert "invalidate=1\n" in text          # every job starts from a cold page cache, as the stores do
    # the phase's bytes are split over the jobs, not multiplied by them
    assert f"io_size={max(1, 128 // numjobs)}M" in jobs[fio.job_name("seqwrite-stripe", 0, engine)]


def test_limit_for_picks_the_pattern_of_the_store_and_phase():
    rows = {("ext4", fio.job_name(p, 0, "io_uring")): {"name": p, "mb_per_s": 100.0} for p in fio.PATTERNS}
    rows.update({("raw", fio.job_name(p, 1, "io_uring")): {"name": p + "-d", "mb_per_s": 50.0} for p in fio.PATTERNS})
    assert fio.limit_for(rows, "ext4", "ufs", "io_uring", "fill")[1]["name"] == "randwrite-mix"
    assert fio.limit_for(rows, "ext4", "largefile", "io_uring", "fill")[1]["name"] == "seqwrite-stripe"
    assert fio.limit_for(rows, "ext4", "largefile", "io_uring", "steady")[1]["name"] == "randread-mix"
    assert fio.limit_for(rows, "raw", "rawdev", "io_uring", "steady")[1]["name"] == "randread-mix-d"
    assert fio.limit_for(rows, "ext4", "ufs", "sync", "fill")[1] is None


def test_a_store_above_its_limit_is_flagged_never_printed_as_a_fraction():
    limit = {"name": "randread-mix-buffered-io_uring", "mb_per_s": 100.0}
    ok = fio.fraction(70.0, limit)
    assert ok["fraction"] == pytest.approx(0.7) and ok["error"] is None
    bad = fio.fraction(130.0, limit)
    assert bad["fraction"] is None and "measurement error" in bad["error"] and "x1.30" in bad["error"]
    assert fio.cell({"steady_vs_fio": None, "steady_fio_error": bad["error"]}, "steady") == "no limit (>1)"
    assert fio.cell({"steady_vs_fio": 0.7, "steady_fio_error": None}, "steady") == "0.70"
    assert fio.cell({"fill_vs_fio": 2.05}, "fill") == "no limit (>1)"      # a file from before the flag


@pytest.mark.skipif(not shutil.which("fio"), reason="fio is not installed")
@pytest.mark.parametrize("engine", sorted(fio.FAMILY))
@pytest.mark.host  # runs fio (the tier: tests/tiers.py)
def test_fio_runs_every_job_it_is_given(tmp_path, engine):
    """The consumer of the job files is fio: each one runs and reports a rate."""
    for name, job in fio.jobs(str(tmp_path / "fio.dat"), 8, 8, 1, 0, fio.mix_bssplit(), engine).items():
        r = fio.run(name, job, tmp_path)
        assert r["available"], r
        assert r["mb_per_s"] > 0 and r["iops"] > 0


@pytest.mark.skipif(not shutil.which("fio"), reason="fio is not installed")
@pytest.mark.host  # runs fio (the tier: tests/tiers.py)
def test_the_limit_is_the_best_of_its_repetitions(tmp_path):
    name, job = next(iter(fio.jobs(str(tmp_path / "fio.dat"), 8, 8, 1, 0, "4k/100", "sync").items()))
    r = fio.best_of(name, job, tmp_path, reps=3)
    assert r["reps"] == 3 and len(r["runs_mb_per_s"]) == 3
    assert r["mb_per_s"] == pytest.approx(max(r["runs_mb_per_s"]), abs=0.1)


def test_the_report_renders_a_measured_storage_result_with_its_limits():
    """Regression: the storage section once shadowed the fio module and crashed every report."""
    import json
    from pathlib import Path
    from proxytune.reports import tables
    data = json.loads((Path(__file__).resolve().parent.parent / "docs/results/report-with-proxy.json").read_text())
    sec = tables.storage_section(data["data"]["sections"]["storage"])
    assert sec.tables[0].headers[-3:-1] == ["fill / fio", "steady / fio"]
    assert any(t.title.startswith("fio limits") for t in sec.tables)

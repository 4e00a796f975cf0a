"""One spec per measurement (reports/measurements.py): the report, compare, the
seeds, the summary, the build cache, the packages and the CLI's bench commands
iterate it, a spec missing a piece fails when it is made, and a new
measurement is one object: shown with a dummy one, its C harness included."""

import json

import pytest

from conftest import REPO
from proxytune.core.sections import Section, Table
from proxytune.microbench import build
from proxytune.microbench.runner import run_json
from proxytune.reports import build as report_build, compare, measurements, progress, seeds, summary, tables, verdicts
from proxytune.reports.measurements import Measurement, Run

HARNESS_C = r'''#include <stdio.h>
int main(int argc, char **argv) { (void)argv; printf("{\"value\": %d}\n", 40 + argc); return 0; }
'''


def dummy_spec(tmp_path) -> Measurement:
    """The one place a new measurement is written (its harness's source aside)."""
    (tmp_path / "dummyc").mkdir()
    (tmp_path / "dummyc/main.c").write_text(HARNESS_C)
    harness = build.Harness("dummybench", str(tmp_path / "dummyc"))     # an absolute directory, for the test

    def run(r: Run) -> dict:
        return {"bench": "dummy", "quick": not r.full, **run_json([build.build(harness), "x"])}

    def section(data: dict) -> Section:
        sec = Section("A dummy measurement", "what the dummy measured")
        sec.tables.append(Table("value", ["value"], [[data["value"]]]))
        return sec

    return Measurement(
        "dummy", "a dummy measurement", (2, 9), "benches", run, None, harness, section,
        ("Dummy values", lambda d: {"value": str(d["value"])}), None,
        lambda d: [{"rank_key": (2, -1.0), "what": "dummy advice", "why": f"value {d['value']}", "command": "true",
                    "source": "bench dummy"}] if d else [],
        ((8, lambda d: seeds.row("dummy seed", "dummies exist", "x2", str(d["value"]),
                                      verdicts.paired([d["value"] / 21] * verdicts.MIN_REPS), 2.0, "",
                                      f"the dummy, {verdicts.MIN_REPS} times"),
          measurements.part_of("dummy")),), False)


@pytest.mark.host  # the report's audit runs ss (the tier: tests/tiers.py)
def test_a_dummy_measurement_from_one_place_is_run_shown_compared_seeded_and_summarised(tmp_path, sandbox,
                                                                                          monkeypatch):
    spec = dummy_spec(tmp_path)
    audit = measurements.by_name("audit")
    monkeypatch.setattr(measurements, "MEASUREMENTS", (audit, spec))
    planned = []

    class Recorder(progress.Sections):
        def __init__(self, plan, quiet=False, stream=None):
            planned.extend(plan)
            super().__init__(plan, quiet, stream)
    monkeypatch.setattr(progress, "Sections", Recorder)
    monkeypatch.setenv("PROXYTUNE_CACHE_DIR", str(tmp_path / "cache"))
    done, skipped, took = report_build.collect(sandbox, "linux/proxy", benches=True, quiet=True)
    assert skipped == {} and done["dummy"]["value"] == 42 and done["dummy"]["command"] == "x"
    assert ("dummy", "a dummy measurement", 2) in planned                 # its label and quick budget
    assert set(took) == {"audit", "dummy"} and all(t >= 0 for t in took.values())
    planned.clear()
    report_build.collect(sandbox, "linux/proxy", benches=True, quiet=True, last={"dummy": 7.5})
    assert ("dummy", "a dummy measurement", 7.5) in planned               # this host's last run, not the budget
    _, _, took = report_build.collect(sandbox, "linux/proxy", benches=True, quiet=True, saved={"dummy": done["dummy"]})
    assert "dummy" not in took                     # read from a file (--from): no time for the next estimate
    done["seeds"] = {"rows": seeds.rows(done)}
    doc = {"data": {"sections": done, "summary": summary.build(done)}}
    assert [s.title for s in tables.sections(doc)][-1] == "A dummy measurement"
    assert done["seeds"]["rows"][-1]["seed"] == "dummy seed" and done["seeds"]["rows"][-1]["verdict"] == "holds"
    assert "dummy advice" in [i["what"] for i in doc["data"]["summary"]]
    grids = compare.compare([{"kind": "report", "data": {"sections": done}, "host": {}, "created": "t"}], ["a"])
    assert ["Hosts and files", "Host audit", "Dummy values"] == [t.title for t in grids["tables"]]
    assert spec.harness in measurements.harnesses()


def test_a_spec_missing_a_piece_fails_when_it_is_made(tmp_path):
    spec = dummy_spec(tmp_path)
    fields = [getattr(spec, f) for f in spec.__dataclass_fields__]
    with pytest.raises(TypeError):
        Measurement(*fields[:-1])                                          # one piece left out
    for name, value, why in (("schema", "bench_nope", "not in the result schema"), ("run", None, "needs `run`"),
                             ("part", "sometimes", "none of"), ("budget", (0, 5), "both positive")):
        with pytest.raises(ValueError, match=why):
            Measurement(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__}, name: value})


def test_the_cli_bench_commands_are_the_measurements_that_have_one():
    from proxytune import cli
    assert set(cli.main.commands["bench"].commands) == {m.name for m in measurements.MEASUREMENTS if m.command}


def test_every_report_part_and_result_schema_has_its_measurement():
    names = [m.name for m in measurements.MEASUREMENTS]
    assert len(names) == len(set(names))
    assert [e[0] for m in measurements.MEASUREMENTS for e in m.seeds] and \
        sorted(e[0] for m in measurements.MEASUREMENTS for e in m.seeds) == list(range(1, 8))
    schema = json.loads((REPO / "reports/schemas/result.json").read_text())
    benches = {r["if"]["properties"]["data"]["properties"]["bench"]["const"] for r in schema["allOf"]
               if "bench" in json.dumps(r["if"])}
    assert benches <= {m.name for m in measurements.MEASUREMENTS if m.schema}


def test_the_last_runs_timings_are_this_hosts_and_of_the_same_kind(tmp_path):
    import platform
    doc = json.loads((REPO / "docs/results/report-with-proxy.json").read_text())      # a measured report's envelope
    doc["host"]["hostname"] = platform.node()                                        # ...as if made here
    doc["data"]["timings"] = {"full": False, "sections": {"storage": 12.5, "events": 9.0}}
    (tmp_path / "report.json").write_text(json.dumps(doc))
    assert report_build.last_timings(tmp_path, full=False) == {"storage": 12.5, "events": 9.0}
    assert report_build.last_timings(tmp_path, full=True) is None                  # a quick run's times
    doc["host"]["hostname"] = "another-host"
    (tmp_path / "report.json").write_text(json.dumps(doc))
    assert report_build.last_timings(tmp_path, full=False) is None
    (tmp_path / "report.json").write_text("not json")
    assert report_build.last_timings(tmp_path, full=False) is None
    assert report_build.last_timings(tmp_path / "none", full=False) is None

"""The latency matrix replayed (issue 28): each cell's recorded doctor
answer (tests/evidence/latency/<cell>.json, with the facts its live run
knew: the origin's address and real delay, where the queue's directive is,
wrk's mean latency) is answered again from its evidence alone, in-process,
without root or proxies: the budget, the findings and the cell's verdict
must hold as they did live. The recorded evidence must also show the cell's
condition, so a passing replay proves the rules on a real slow origin or a
real queue."""

import json
from pathlib import Path

import pytest

import latency_cells as lc

RECORDED = sorted(lc.EVIDENCE.glob("*.json"))


def replay(doc: dict) -> dict:
    from proxytune.probes import doctor
    data = doc["data"]
    again = doctor.answer(data["evidence"], data["target"]["pids"])
    return {**doc, "data": {**data, **{k: v for k, v in again.items() if k != "evidence"}},
            "findings": again["findings"]}


def test_every_cell_ci_plays_has_its_recorded_evidence():
    """At least the lean matrix's cells (a cell of the full matrix is kept when its live looks passed)."""
    assert set(lc.LEAN) <= {p.stem for p in RECORDED} <= set(lc.BY_NAME), "re-record: see docs/DIAGNOSIS.md"


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_replayed_budget_gives_the_cells_verdict(path: Path):
    doc = json.loads(path.read_text())
    cell = lc.BY_NAME[path.stem]
    m = doc["latency"]
    assert m["cell"] == cell.name
    assert not [p for p in lc.condition_problems(cell, doc, m) if p.startswith("harness")], \
        "recorded evidence does not show the cell's condition"
    problems = lc.verdict_problems(cell, replay(doc), m)
    assert not problems, f"{cell.name} ({cell.expect}): {problems}"

"""The own-cap rules replayed on the evidence the live matrix recorded
(tests/evidence/owncap/<cell>.json, one doctor answer per cell): the same
expected verdict as the live cell, in-process, without root or proxies.
The recorded answer must also show the condition its cell is about (the
proxy at its cap, or a healthy proxy under paced load), so a replay that
passes proves the rule on a real cap, not on an idle proxy."""

import json
from pathlib import Path

import pytest

import matrix

RECORDED = sorted(matrix.EVIDENCE.glob("*.json"))


def replay(doc: dict) -> dict:
    """Today's rules on the recorded evidence, as doctor.diagnose ranks them, with the headroom they give."""
    from proxytune.probes import findings, owncap, proxies_findings
    ev = doc["data"]["evidence"]
    found = proxies_findings.cpu_bound(proxies_findings.refine(findings.evaluate(ev), ev), ev)
    headroom = owncap.headroom(proxies_findings.caps(ev) if ev.get("proxy") else [], ev)
    return {**doc, "findings": [f.to_json() for f in found], "data": {**doc["data"], "headroom": headroom}}


def test_every_cell_has_its_recorded_evidence():
    assert {p.stem for p in RECORDED} == set(matrix.BY_NAME), "re-record: see docs/DIAGNOSIS.md"


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem, marks=pytest.mark.xfail(
    reason=matrix.KNOWN_OPEN[p.stem], strict=False)) if p.stem in matrix.KNOWN_OPEN else pytest.param(p, id=p.stem)
    for p in RECORDED])
def test_replayed_rules_give_the_cells_verdict(path: Path):
    doc = json.loads(path.read_text())
    cell = matrix.BY_NAME[path.stem]
    assert doc["matrix"]["cell"] == cell.name
    assert not matrix.condition_problems(cell, doc), "recorded evidence does not show the cell's condition"
    again = replay(doc)
    problems = matrix.verdict_problems(cell, again, doc["matrix"]["where"])
    assert not problems, f"{cell.name} ({cell.expect}): {problems}"

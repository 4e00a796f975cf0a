"""The generic-failure matrix's recorded runs (tests/evidence/generic/<cell>.json, one doctor run per
cell of tests/test_matrix_generic.py, its whole JSON) replayed through today's rules: the evidence a
real proxy gave must still give the cell's verdict. No root, no proxy: the rules read evidence only."""

import json
from pathlib import Path

import pytest

import generic_cells as g

EVIDENCE = Path(__file__).parent / "evidence" / "generic"


def test_every_cell_has_its_recorded_run():
    assert sorted(p.stem for p in EVIDENCE.glob("*.json")) == sorted(g.EXPECT)


@pytest.mark.parametrize("cell", sorted(g.EXPECT))
def test_recorded_evidence_gives_the_cells_verdict(cell):
    from proxytune.probes import findings, proxies_findings
    doc = json.loads((EVIDENCE / f"{cell}.json").read_text())
    ev = doc["data"]["evidence"]
    assert (ev["proxy"] or {}).get("kind") == g.EXPECT[cell][0]
    found = proxies_findings.refine(findings.evaluate(ev), ev)
    wrong = g.verdict_errors(cell, [(f.id, f.fix) for f in found])
    assert not wrong, (wrong, [f["id"] for f in doc["findings"]])
    if cell in g.ABSENT:                    # the note names another listener, with its process, not the proxy's
        note = next(f for f in found if f.id == "other-listener-overflow")
        named = {o["local"] for o in note.evidence["overflowed"] if (o.get("process") or {}).get("pid")}
        assert named and not named & {l["local"] for l in ev["listeners"]}, note.evidence

"""One audit builder: `tune check`, `report` and `doctor` show the same audit."""

import json

import pytest

from proxytune.tune import audit


def _settings(doc):
    return [(s["setting"], s["status"], s["current"]) for s in doc["settings"]]


@pytest.mark.host  # the audit runs ss (the tier: tests/tiers.py)
def test_check_report_and_doctor_build_the_same_audit(sandbox, cli):
    from proxytune.probes import doctor
    from proxytune.reports import build as report_build
    params = {"service": "ptaudit", "cache_dirs": []}
    mine = audit.build(sandbox, "linux/proxy", params)
    r = cli("tune", "check", "--json", "--service", "ptaudit")
    assert r.exit_code == mine.exit_code(), r.output
    checked = json.loads(r.output)["data"]
    assert _settings(checked) == _settings(mine.to_json())
    assert checked["observations"] == mine.observations
    done, skipped, _ = report_build.collect(sandbox, "linux/proxy", benches=False)     # the report detects its service
    assert not skipped and _settings(done["audit"]) == _settings(audit.build(sandbox, "linux/proxy").to_json())
    found = doctor.audit(sandbox, "linux/proxy", "ptaudit", [])
    assert found["available"] and found["drift"] == mine.drift()
    assert found["summary"] == checked["summary"]


@pytest.mark.host  # the audit runs ss (the tier: tests/tiers.py)
def test_the_check_terminal_prints_the_report_section(sandbox, cli):
    """The terminal shows the section the report writes: same title, same tables."""
    mine = audit.build(sandbox, "linux/proxy", {"service": "ptaudit"})
    sec = audit.section(mine.to_json(), "tune check: linux/proxy")
    r = cli("--format", "tsv", "tune", "check", "--service", "ptaudit")
    lines = r.output.splitlines()
    assert lines[0] == f"# {sec.title}" and lines[1] == f"# {sec.intro}"     # piped: beside the rows, comments
    for table in sec.tables:
        at = lines.index(f"# {table.title}")
        assert lines[at + 1] == "\t".join(table.headers)
        assert len([l for l in lines[at + 2:at + 2 + len(table.rows)] if l.count("\t") == len(table.headers) - 1]) \
            == len(table.rows)

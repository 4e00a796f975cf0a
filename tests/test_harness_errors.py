"""A C harness that fails to build, or builds and then crashes, never breaks
`bench ... --json`: stdout is still one valid result document that says what
was unavailable and why; stderr has one error line; exit 2."""

import json
import os
import stat

import pytest

from conftest import proxytune
from proxytune.reports.schema import validate

FAILING_CC = """#!/bin/sh
[ "$1" = "--version" ] && { echo "failcc 1"; exit 0; }
echo "main.c:1:1: error: injected compiler failure" >&2
exit 1
"""

# "Builds" a harness that lists one mechanism, then is killed by SIGSEGV on every measurement.
CRASHING_CC = """#!/bin/sh
[ "$1" = "--version" ] && { echo "crashcc 1"; exit 0; }
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
cat > "$out" <<'HARNESS'
#!/bin/sh
case "$*" in
  *"--mode list"*) echo '{"backends": [{"name": "poll", "available": true, "reason": ""}]}' ;;
  *) kill -SEGV $$ ;;
esac
HARNESS
chmod +x "$out"
"""


def _cc(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return {"CC": str(path), "PROXYTUNE_CACHE_DIR": str(tmp_path / "cache")}


def _one_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("proxytune:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize("bench", ["events", "fdscan"])
def test_a_harness_that_fails_to_build_still_prints_valid_json(bench, tmp_path):
    env = _cc(tmp_path, "failcc", FAILING_CC)
    r = proxytune("bench", bench, "--quick", "--json", "-o", str(tmp_path / "r.json"), env=env, timeout=300)
    assert r.returncode == 2, r.stderr
    doc = json.loads(r.stdout)
    validate(doc)
    assert doc["data"]["bench"] == bench and doc["data"]["available"] is False
    assert "injected compiler failure" in doc["data"]["reason"]
    assert f"bench {bench}: building" in _one_error(r.stderr)
    assert json.loads((tmp_path / "r.json").read_text())["data"] == doc["data"]


def test_no_compiler_at_all_is_said_in_the_json(tmp_path):
    env = {"CC": "/nonexistent/cc", "PROXYTUNE_CACHE_DIR": str(tmp_path / "cache")}
    r = proxytune("bench", "fdscan", "--quick", "--json", "-o", str(tmp_path / "r.json"), env=env)
    assert r.returncode == 2
    doc = json.loads(r.stdout)
    assert doc["data"]["available"] is False and "no C compiler found" in doc["data"]["reason"]


def test_a_harness_that_crashes_on_every_point_keeps_the_json_whole(tmp_path):
    env = _cc(tmp_path, "crashcc", CRASHING_CC)
    r = proxytune("bench", "events", "--quick", "--backend", "poll", "--json", "-o", str(tmp_path / "r.json"),
                  env=env, timeout=300)
    assert r.returncode == 2, r.stderr
    doc = json.loads(r.stdout)
    validate(doc)
    data = doc["data"]
    assert data["idle"] and all(not p["available"] and "SIGSEGV" in p["reason"] for p in data["idle"])
    modes = {p["mode"] for p in data["unavailable_points"]}
    assert modes == {"idle", "load", "libevent"}, modes         # --quick runs no churn (bench events only)
    assert all("killed by SIGSEGV" in p["reason"] and p["available"] is False for p in data["unavailable_points"])
    assert data["churn"] == [] and data["load"] == [] and data["libevent"] == []
    assert "measurement(s) failed" in _one_error(r.stderr)


def test_the_terminal_shows_the_unavailable_bench_as_its_section(tmp_path):
    env = {**_cc(tmp_path, "failcc", FAILING_CC), "PROXYTUNE_FORMAT": "tsv"}
    r = proxytune("bench", "fdscan", "--quick", "-o", str(tmp_path / "r.json"), env=env)
    assert r.returncode == 2
    assert "bench fdscan: unavailable" in r.stdout and "injected compiler failure" in r.stdout
    assert _one_error(r.stderr).startswith("proxytune: error: bench fdscan: building fdscan failed")
    assert os.path.exists(tmp_path / "r.json")


@pytest.mark.host  # runs a stand-in compiler (the tier: tests/tiers.py)
def test_a_compiler_that_writes_nothing_is_a_build_failure_not_a_cached_binary(tmp_path, monkeypatch):
    """CC=/bin/true exits 0 and writes no program: said as such, and nothing cached for the next run."""
    from proxytune.microbench import build, fdscan
    from proxytune.microbench.runner import HarnessError
    monkeypatch.setenv("CC", "/bin/true")
    monkeypatch.setenv("PROXYTUNE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(HarnessError, match="wrote no program"):
        build.build(fdscan.HARNESS)
    assert not list((tmp_path / "cache").rglob("fdscan-*"))

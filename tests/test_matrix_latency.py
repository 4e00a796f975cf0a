"""The latency matrix, live (issue 28, item 3): each cell of
latency_cells.CELLS starts a slow or fast origin, its real proxy and wrk
once, then runs the doctor RUNS times in a row; every answer is judged
(latency_cells.verdict_problems) and must come from a load that made the
cell's condition (condition_problems). wrk runs across the looks and is
stopped with SIGINT after them: its mean latency is what the budget's
total must agree with. Every answer's JSON is kept with the facts the test
knows (PROXYTUNE_EVIDENCE_DIR, else the test's tmp dir) and one line per
look goes to PROXYTUNE_LATENCY_RESULTS when set (diagnosis_doc.py renders
docs/DIAGNOSIS.md from it and keeps one answer per cell for the replay)."""

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

import latency_cells as lc
import matrix
from conftest import proxytune
from test_doctor import stop
from test_matrix_owncap import _fds, _netns, pytestmark  # noqa: F401  (a namespace of its own, fds, root)


@pytest.fixture(scope="module")
def fast_origin(_netns):
    from proxytune.microbench import servers
    with servers.Nginx(connections=8192) as fast:
        yield fast.port


def doctor(pid: int, window: str) -> dict:
    r = proxytune("doctor", "--pid", str(pid), "--duration", window, "--no-perf", "--json", timeout=120)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    return json.loads(r.stdout)


def end_wrk(load: subprocess.Popen) -> dict:
    """SIGINT: wrk stops and prints its summary (wrk.c handler), which is parsed."""
    if load.poll() is None:
        load.send_signal(signal.SIGINT)
    try:
        out, _ = load.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        stop(load)
        out = ""
    return lc.wrk_summary(out or "")


@pytest.mark.parametrize("cell", lc.selected(), ids=lambda c: c.name)
def test_latency_cell(cell, fast_origin, tmp_path):
    if not Path(matrix.BINARY[cell.proxy]).exists():
        pytest.skip(f"{matrix.BINARY[cell.proxy]} is not installed")
    keep = matrix.evidence_dir(tmp_path)
    slow = None
    if cell.delay:
        slow, origin = matrix.start_slow_origin(cell.delay)
    else:
        origin = fast_origin
    try:
        srv, conf = lc.server(cell, origin)
        script = tmp_path / "load.lua"
        script.write_text(lc.lua(cell, origin))
        t0 = time.monotonic()
        with srv:
            where = lc.where_set(cell, conf) if cell.shape == "queue" else None
            load = lc.wrk(srv.port, cell.conns, script)
            docs = []
            try:
                time.sleep(cell.settle_s)                  # the queue, the connections and the clock settle
                t1 = time.monotonic()
                for run in range(lc.RUNS):
                    docs.append(doctor(srv.pid, cell.window))
            finally:
                client = end_wrk(load)
        print(f"timing {cell.name}: start+settle {t1 - t0:.1f} s, looks {time.monotonic() - t1:.1f} s; wrk {client}")
    finally:
        if slow:
            stop(slow)
    bad = []
    for run, doc in enumerate(docs):
        m = lc.look_facts(cell, origin, where, client)
        doc["latency"] = {"cell": cell.name, "run": run, **m}
        (keep / f"{cell.name}.run{run}.json").write_text(json.dumps(doc, default=str))
        problems = lc.condition_problems(cell, doc, m) + lc.verdict_problems(cell, doc, m)
        lc.append_result(lc.results_line(cell, run, doc, m, problems))
        print(cell.name, run, [f["id"] for f in doc["findings"]], lc.agreement(doc, m["client_ms"]),
              lc.budget_of(doc).get("parts", {}).get("origin_first_byte", {}).get("ms"))
        bad += [f"run {run}: {p}" for p in problems]
    assert not bad, f"{cell.name} ({cell.expect}):\n" + "\n".join(bad)

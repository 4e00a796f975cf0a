"""The own-cap matrix, live: each cell of matrix.CELLS starts its real proxy
and its load once, then runs the doctor RUNS times in a row; every answer
must rank the proxy's own cap first, name its directive and `file:line`,
and never send the user to somaxconn (a healthy cell: nothing high or
medium). Each answer is also checked to come from a proxy that really was
at its cap (the listener's accept queue, its connections, fds or threads,
read from the evidence), so a passing cell means something. Every answer's
JSON is kept (PROXYTUNE_EVIDENCE_DIR, else the test's tmp dir) and one line
per run goes to PROXYTUNE_MATRIX_RESULTS when set (diagnosis_doc.py)."""

import ctypes
import json
import os
import resource
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import matrix
from conftest import IS_ROOT, proxytune
from test_doctor import stop

CLONE_NEWNET = 0x40000000
pytestmark = pytest.mark.skipif(not (IS_ROOT and shutil.which("bpftrace") and shutil.which("wrk")),
                                reason="needs root, bpftrace and wrk")


@pytest.fixture(scope="module", autouse=True)
def _netns():
    """The whole module in a network namespace of its own (this thread, and every process and thread
    it starts): the doctor's TcpExt counters are then this matrix's alone, not those of other loads
    on the machine, and nothing can leave through a route. The original namespace is back after."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    if libc.unshare(CLONE_NEWNET) != 0:
        os.close(home)
        pytest.skip(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
    try:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        yield
    finally:
        libc.setns(home, CLONE_NEWNET)
        os.close(home)


@pytest.fixture(scope="module", autouse=True)
def _fds():
    """Room for the held clients: the soft fd limit up to the hard one (20,000 here), restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="module")
def origins(_netns):
    """One fast origin (nginx, cacheable `ok`) and one slow (matrix.SLOW_S per answer, no-store),
    shared by every cell of the module."""
    from proxytune.microbench import servers
    slow, slow_port = matrix.start_slow_origin()
    try:
        with servers.Nginx(connections=8192) as fast:
            yield {"fast": fast.port, "slow": slow_port}
    finally:
        stop(slow)


def doctor(pid: int, perf: bool = False) -> dict:
    r = proxytune("doctor", "--pid", str(pid), "--duration", matrix.WINDOW, *([] if perf else ["--no-perf"]),
                  "--json", timeout=180)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    return json.loads(r.stdout)


def look(cell, srv, where: str, keep: Path, idle) -> list[tuple[int, list[str]]]:
    """RUNS doctor answers on the loaded proxy: each saved, recorded and judged. Around each look the
    harness reads what the proxy itself says: nginx's request count (stub_status), the maxconn haproxy -V
    said it derived."""
    out = []
    for run in range(matrix.RUNS):
        closed = idle.closed
        served = matrix.nginx_requests(srv.port) if cell.proxy == "nginx" and cell.stats else None
        doc = doctor(srv.pid, cell.perf)
        doc["matrix"] = {"cell": cell.name, "where": where, "run": run, "idle_closed_in_window": idle.closed - closed}
        now = matrix.nginx_requests(srv.port) if served else None
        if served and now:             # at worker_connections nginx accepts no status request either: not read
            doc["matrix"]["requests_per_s"] = round((now[0] - served[0]) / (now[1] - served[1]))
        if cell.derived:
            doc["matrix"]["haproxy_maxconn"] = srv.said_maxconn()
        (keep / f"{cell.name}.run{run}.json").write_text(json.dumps(doc, default=str))
        problems = matrix.condition_problems(cell, doc) + matrix.verdict_problems(cell, doc, where)
        matrix.append_result(matrix.results_line(cell, run, doc, problems))
        print(cell.name, run, [f["id"] for f in doc["findings"]], matrix.pressure(doc))
        out.append((run, problems))
    return out


def _marked(cell):
    why = matrix.KNOWN_OPEN.get(cell.name)
    return pytest.param(cell, id=cell.name, marks=pytest.mark.xfail(reason=why, strict=False)) if why else \
        pytest.param(cell, id=cell.name)


@pytest.mark.parametrize("cell", [_marked(c) for c in matrix.CELLS])
def test_owncap_cell(cell, origins, tmp_path):
    if not Path(matrix.BINARY[cell.proxy]).exists():
        pytest.skip(f"{matrix.BINARY[cell.proxy]} is not installed")
    origin = origins["slow" if cell.shape == "slow" else "fast"]
    srv, conf = matrix.server(cell, origin)
    script = tmp_path / "load.lua"
    script.write_text(matrix.lua(cell, origins["fast"]))
    keep = matrix.evidence_dir(tmp_path)
    t0 = time.monotonic()
    with srv:
        t1 = time.monotonic()
        where = matrix.expected_where(cell, conf)
        with matrix.IdleClients(srv.port, cell.idle, matrix.request(cell, f"127.0.0.1:{srv.port}", origins["fast"])) \
                as idle:
            sent = idle.wait(min(cell.idle, cell.cap_value or srv.said_maxconn() or cell.idle), 10)
            load = matrix.wrk(srv.port, cell.wrk, script)
            try:
                time.sleep(1)                                  # the load settles at the cap
                t2 = time.monotonic()
                runs = look(cell, srv, where, keep, idle)
            finally:
                stop(load)
        t3 = time.monotonic()
    print(f"timing {cell.name}: start {t1 - t0:.1f} s, load {t2 - t1:.1f} s, looks {t3 - t2:.1f} s, "
          f"stop {time.monotonic() - t3:.1f} s")
    bad = [f"run {run}: {p}" for run, problems in runs for p in problems]
    assert not bad, f"{cell.name} ({cell.expect}; idle sent {sent}):\n" + "\n".join(bad)

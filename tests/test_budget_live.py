"""The time budget's kernel mechanisms on a real proxy, without the proxy's
own clocks: nginx (no access log, so nothing of its own to read) as a
reverse proxy in a network namespace of this module's own, in front of an
origin whose delay the test knows. Three doctor looks per shape, each one
judged: the origin's measured wait against its real delay (±25 %), the
budget's total against wrk's mean latency (±30 %), `slow-origin` first with
the origin's address; and a fast origin under paced load gets no budget
finding at all."""

import json
import re
import shutil
import signal
import subprocess
import time

import pytest

import matrix
from conftest import IS_ROOT, proxytune
from test_doctor import stop
from test_matrix_owncap import _fds, _netns  # noqa: F401  (module fixtures: the namespace, the fd limit)

pytestmark = pytest.mark.skipif(not (IS_ROOT and shutil.which("bpftrace") and shutil.which("wrk")
                                     and shutil.which("nginx")), reason="needs root, bpftrace, wrk and nginx")
LOOKS = 3
SLOW = 'request = function() return wrk.format("GET", "/slow/" .. math.random(1000000000)) end\n'
PACED = 'request = function() return wrk.format("GET", "/") end\ndelay = function() return 100 end\n'


def look(pid: int) -> dict:
    r = proxytune("doctor", "--pid", str(pid), "--duration", "3", "--no-perf", "--json", timeout=120)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    return json.loads(r.stdout)["data"]


def wrk_mean_ms(out: str) -> float:
    m = re.search(r"Latency\s+([\d.]+)(us|ms|s)\b", out)
    assert m, out
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


def looks_under_load(pid: int, port: int, conns: int, script: str, tmp_path) -> tuple[list[dict], str]:
    """LOOKS doctor answers on pid while wrk runs against port, and wrk's output over that time."""
    lua = tmp_path / "load.lua"
    lua.write_text(script)
    load = subprocess.Popen(["wrk", "-t2", f"-c{conns}", "-d600s", "-s", str(lua), f"http://127.0.0.1:{port}/"],
                            stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        answers = [look(pid) for _ in range(LOOKS)]
    finally:
        load.send_signal(signal.SIGINT)                     # wrk prints its summary on SIGINT
        out = load.communicate(timeout=30)[0]
    return answers, out


@pytest.mark.parametrize("delay", [0.15, 0.4])
def test_a_slow_origin_is_named_with_its_measured_wait(delay, tmp_path):
    from proxytune.microbench import servers
    origin, port = matrix.start_slow_origin(delay)
    try:
        with servers.Nginx(body=f"proxy_pass http://127.0.0.1:{port};") as ng:
            answers, wrk_out = looks_under_load(ng.pid, ng.port, 40, SLOW, tmp_path)
    finally:
        stop(origin)
    mean, bad = wrk_mean_ms(wrk_out), []
    for i, d in enumerate(answers):
        b, ids = d["budget"], [f["id"] for f in d["findings"]]
        fb = b["parts"]["origin_first_byte"]
        print(f"delay {delay}: look {i}", ids, round(fb["ms"] or 0, 1), round(b["total_ms"], 1), "wrk", mean)
        if not ids or ids[0] != "slow-origin":
            bad.append(f"look {i}: first finding {ids[:1]}, expected slow-origin")
        elif f"127.0.0.1:{port}" not in json.dumps(d["findings"][0]["evidence"]["origins"]):
            bad.append(f"look {i}: origin 127.0.0.1:{port} not named: {d['findings'][0]['evidence']['origins']}")
        if not (fb["ms"] and abs(fb["ms"] / (delay * 1000) - 1) <= 0.25):
            bad.append(f"look {i}: origin wait {fb['ms']} ms for a {delay * 1000:.0f} ms origin")
        if abs(b["total_ms"] / mean - 1) > 0.30:
            bad.append(f"look {i}: budget total {b['total_ms']} ms against wrk's mean {mean} ms")
    assert not bad, "\n".join(bad)


def test_a_healthy_fast_proxy_gets_its_budget_and_no_finding_from_it(tmp_path):
    from proxytune.microbench import servers
    with servers.Nginx(connections=8192) as origin, \
            servers.Nginx(body=f"proxy_pass http://127.0.0.1:{origin.port};") as ng:
        answers, _ = looks_under_load(ng.pid, ng.port, 4, PACED, tmp_path)
    budget_ids = {"slow-origin", "proxy-queue", "accept-wait", "proxy-cpu", "loop-lag"}
    for i, d in enumerate(answers):
        b = d["budget"]
        print("healthy look", i, [f["id"] for f in d["findings"]], b["total_ms"], b["requests"])
        assert not budget_ids & {f["id"] for f in d["findings"]}, (i, d["findings"])
        assert d["verdict"] == "no limit found", (i, d["findings"])
        assert b["requests"]["n"] and 0 < b["total_ms"] < 40, (i, b)
        assert b["parts"]["origin_connect"]["samples"] > 0        # nginx opens an origin connection per request

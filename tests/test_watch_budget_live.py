"""`proxytune watch` where no cap is hit, on a real nginx reverse proxy in a network namespace of this
module's own: a slow origin under load gives one `slow-origin` episode that starts and ends with the
load, a healthy proxy (a fast origin, paced load) gives none, and a reload's new workers are followed.
Run under the heavy lock: it starts proxies, wrk and bpftrace.

The healthy span is HEALTHY_S (30 s of 2 s windows: 15 windows judged). The issue's ten minutes run with
PROXYTUNE_WATCH_HEALTHY_S=600; tests/watch_cost.py's busy hour reports the episodes of its span too."""

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

import matrix
from conftest import IS_ROOT, proxytune, wait_for
from test_doctor import stop
from test_matrix_owncap import _fds, _netns  # noqa: F401  (module fixtures: the namespace, the fd limit)
from test_watch_live import _tail, proxytune_argv
from proxytune.probes import recorder

pytestmark = pytest.mark.skipif(not (IS_ROOT and shutil.which("bpftrace") and shutil.which("wrk")
                                     and shutil.which("nginx")), reason="needs root, bpftrace, wrk and nginx")
WINDOW = 2.0
HEALTHY_S = int(os.environ.get("PROXYTUNE_WATCH_HEALTHY_S", "30"))
SLOW = 'request = function() return wrk.format("GET", "/slow/" .. math.random(1000000000)) end\n'
PACED = 'request = function() return wrk.format("GET", "/") end\ndelay = function() return 100 end\n'


def watcher(pid: int, state) -> subprocess.Popen:
    return subprocess.Popen([*proxytune_argv(), "--state-dir", str(state), "watch", "--pid", str(pid),
                             "--window", str(WINDOW), "--no-perf", "--max-size", "4M"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wrk(port: int, conns: int, seconds: int, script: str, tmp_path) -> subprocess.Popen:
    lua = tmp_path / "load.lua"
    lua.write_text(script)
    return subprocess.Popen(["wrk", "-t2", f"-c{conns}", f"-d{seconds}s", "-s", str(lua),
                             f"http://127.0.0.1:{port}/"], stdout=subprocess.DEVNULL)


def end(w: subprocess.Popen) -> None:
    """Ctrl-C, as an operator ends it: exit 130 and the recorder closed."""
    w.send_signal(signal.SIGINT)
    _, err = w.communicate(timeout=60)
    assert w.returncode == 130, err[-2000:]


def history(state) -> list[dict]:
    r = proxytune("--state-dir", str(state), "watch", "history", "--json")
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)["data"]["episodes"]


def test_a_slow_origin_under_load_is_one_episode_with_the_load(tmp_path):
    """A 300 ms origin behind nginx, 40 clients for 12 s: the time budget names the origin in every
    loaded window, so one slow-origin episode opens within a window of the load and closes within one
    after it (a window straddling an edge may go either way)."""
    from proxytune.microbench import servers
    origin, port = matrix.start_slow_origin(0.3)
    state, w = tmp_path / "state", None
    try:
        with servers.Nginx(body=f"proxy_pass http://127.0.0.1:{port};") as ng:
            w = watcher(ng.pid, state)
            assert wait_for(lambda: len(recorder.read(state / "watch").records) >= 2, timeout=120), _tail(w)
            on = time.time()
            wrk(ng.port, 40, 12, SLOW, tmp_path).wait(timeout=60)
            off = time.time()
            time.sleep(3 * WINDOW)
            end(w)
    finally:
        if w:
            stop(w)
        stop(origin)
    recs = recorder.read(state / "watch").records
    seen = [(round(x["t0"] - on, 1), [f["id"] for f in x["findings"]]) for x in recs]
    eps = [e for e in history(state) if e["severity"] in ("high", "medium")]
    assert [e["finding"] for e in eps] == ["slow-origin"], seen
    assert abs(eps[0]["start"] - on) <= WINDOW + 1.0 and abs(eps[0]["end"] - off) <= WINDOW + 1.0, (eps, on, off, seen)
    assert sum(x["status"] == "failed" for x in recs) == 0, [x.get("reason") for x in recs]


def test_a_healthy_proxy_gives_no_episode(tmp_path):
    """A fast origin behind nginx, 4 clients paced to 10 requests/s each, HEALTHY_S of 2 s windows: every
    window watched, none with a finding, so no episode."""
    from proxytune.microbench import servers
    state, w = tmp_path / "state", None
    with servers.Nginx(connections=8192) as origin, \
            servers.Nginx(body=f"proxy_pass http://127.0.0.1:{origin.port};") as ng:
        load = wrk(ng.port, 4, HEALTHY_S + 60, PACED, tmp_path)
        try:
            w = watcher(ng.pid, state)
            assert wait_for(lambda: len(recorder.read(state / "watch").records) >= 1, timeout=120), _tail(w)
            time.sleep(HEALTHY_S)
            end(w)
        finally:
            load.kill()
            load.wait()
            if w:
                stop(w)
    recs = recorder.read(state / "watch").records
    assert len(recs) >= HEALTHY_S / WINDOW * 0.8, len(recs)
    assert {x["status"] for x in recs} == {"watched"}, [x.get("reason") for x in recs if x["status"] != "watched"]
    assert history(state) == [], [(x["seq"], [f["id"] for f in x["findings"]]) for x in recs if x["findings"]]


def test_a_reload_s_new_workers_are_watched(tmp_path):
    """SIGHUP to nginx's master: new workers start and the old ones leave. The watcher's next windows
    watch the new workers (a new session attached to them), and no window fails on the way."""
    from proxytune.microbench import servers
    state, w = tmp_path / "state", None

    def watched_pids() -> list[set[int]]:
        return [set(r["body"]["target"]["pids"]) for r in recorder.read(state / "watch").records
                if r["status"] == "watched"]

    try:
        with servers.Nginx() as ng:
            w = watcher(ng.pid, state)
            assert wait_for(lambda: len(watched_pids()) >= 2, timeout=120), _tail(w)
            before = watched_pids()[-1]
            os.kill(ng.pid, signal.SIGHUP)
            assert wait_for(lambda: any(ng.pid in p and p - before for p in watched_pids()), timeout=120), \
                (before, watched_pids()[-3:], _tail(w))
            end(w)
    finally:
        if w:
            stop(w)
    recs = recorder.read(state / "watch").records
    assert sum(x["status"] == "failed" for x in recs) == 0, [x.get("reason") for x in recs]

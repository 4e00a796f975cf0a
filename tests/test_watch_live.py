"""`proxytune watch` on a real HAProxy (Debian's), in a loopback-only network namespace: the target
followed through a restart and an absence, one record per window, Ctrl-C is exit 130 and leaves a
readable recorder. Run under the heavy lock: it starts a proxy, bpftrace and perf."""

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import IS_ROOT, proxytune, wait_exec, wait_for
from proxytune.core import procfs
from proxytune.probes import locate, recorder

pytestmark = pytest.mark.skipif(not (IS_ROOT and shutil.which("haproxy") and shutil.which("bpftrace")),
                                reason="needs root, haproxy and bpftrace")

CONFIG = """global
    maxconn 100
defaults
    mode http
    timeout connect 1s
    timeout client 5s
    timeout server 5s
frontend fe
    bind 127.0.0.1:18080
    http-request return status 200 content-type text/plain string ok
"""


def start_haproxy(tmp_path, stats: bool = False) -> subprocess.Popen:
    cfg = tmp_path / "haproxy.cfg"
    sock = f"    stats socket {tmp_path}/haproxy.sock mode 600\n" if stats else ""
    cfg.write_text(CONFIG.replace("global\n", "global\n" + sock, 1))
    p = subprocess.Popen(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec haproxy -db -f "$1"', "sh",
                          str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_exec(p, "haproxy")
    return p


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(timeout=30)


@pytest.fixture
def no_other_haproxy():
    if locate.masters("haproxy")[0]:
        pytest.skip("another haproxy runs on this host: the follow-a-restart check would be ambiguous")


def test_the_locator_follows_a_restart_and_says_when_the_proxy_is_absent(tmp_path, no_other_haproxy):
    first = start_haproxy(tmp_path)
    second = None
    try:
        loc = locate.Locator(pid=first.pid)
        pids, line = loc.find()
        assert pids[0] == first.pid and line is None and loc.kind == "haproxy"
        stop(first)
        pids, line = loc.find()
        assert pids == [] and line == "no haproxy is running; waiting for one"
        assert loc.find() == ([], None)                  # said once
        second = start_haproxy(tmp_path)
        pids, line = loc.find()
        assert pids[0] == second.pid
        assert line == f"haproxy restarted: following its new master pid {second.pid} (was {first.pid})"
        assert locate.Locator().find()[0][0] == second.pid   # detected without --pid too
    finally:
        stop(first)
        if second:
            stop(second)


def test_watch_records_windows_and_ctrl_c_exits_130(tmp_path, no_other_haproxy):
    hp = start_haproxy(tmp_path, stats=True)
    state = tmp_path / "state"
    w = None
    try:
        w = subprocess.Popen([*proxytune_argv(), "--state-dir", str(state), "watch", "--pid", str(hp.pid),
                              "--window", "2", "--no-perf", "--max-size", "1M"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert wait_for(lambda: len(recorder.read(state / "watch").records) >= 2, timeout=120), _tail(w)
        w.send_signal(signal.SIGINT)
        out, err = w.communicate(timeout=60)
        assert w.returncode == 130, err
        assert "watching" in err or "recording" in err
        assert "stopped after" in err and "Traceback" not in err
    finally:
        if w:
            stop(w)
        stop(hp)
    recs = recorder.read(state / "watch").records
    assert [r["status"] for r in recs[:2]] == ["watched", "watched"], recs[0].get("reason")
    body = recs[0]["body"]
    assert body["target"]["pids"][0] == hp.pid and recs[0]["proxy"] == "haproxy"
    assert 1.5 < body["window_s"] < 4 and body["verdict"] in ("no limit found", "limited")
    # back to back: a window's opening reads are the last one's closing reads. HAProxy counts each
    # `show info` on its stats socket in CumConns, so a read of its own would be one more
    before, after = (recs[i]["body"]["evidence"]["proxy"] for i in (1, 0))
    assert after["stats_after"]["available"] and after["stats_after"]["CumConns"] >= 2, after["stats_after"]
    assert before["stats_before"] == after["stats_after"]
    assert procfs.read_stat(hp.pid) is None or procfs.read_stat(hp.pid).gone
    r = proxytune("--state-dir", str(state), "watch", "history", "--json")
    assert r.returncode in (0, 1), r.stderr
    assert json.loads(r.stdout)["data"]["recorder"] == str(state / "watch")


def proxytune_argv() -> list[str]:
    from conftest import CLI, REPO
    return [str(REPO / ".venv/bin/python"), str(CLI)]


def _tail(p: subprocess.Popen) -> str:
    if p.poll() is None:
        return "watcher still running, no records yet"
    return p.stderr.read()[-2000:]


def test_sigterm_ends_the_watch_cleanly_and_a_vanished_non_proxy_is_said_once(tmp_path):
    sleeper = subprocess.Popen(["sleep", "600"])
    state = tmp_path / "state"
    w = subprocess.Popen([*proxytune_argv(), "--state-dir", str(state), "watch", "--pid", str(sleeper.pid),
                          "--window", "1", "--no-perf", "--max-size", "1M"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(recorder.read(state / "watch").records) >= 1, timeout=120), _tail(w)
        stop(sleeper)
        # two absent windows: the second at least went through the locator, which says why once
        assert wait_for(lambda: sum(r["status"] == "absent" for r in recorder.read(state / "watch").records) >= 2,
                        timeout=60), _tail(w)
        w.send_signal(signal.SIGTERM)
        out, err = w.communicate(timeout=60)
    finally:
        stop(sleeper)
        stop(w)
    assert w.returncode == 130, err
    assert err.count("it is no proxy proxytune knows, so it cannot be followed") == 1, err
    assert "stopped after" in err and "Traceback" not in err


BUSY_CONFIG = CONFIG.replace("maxconn 100", "maxconn 50").replace("18080", "18082")


def busy(hp: subprocess.Popen, seconds: int) -> subprocess.Popen:
    """wrk in haproxy's namespace, 150 connections against its global maxconn 50 (the own-cap
    matrix's haproxy-busy-global50 shape)."""
    return subprocess.Popen(["nsenter", "-t", str(hp.pid), "-n", "wrk", "-t2", "-c150", f"-d{seconds}s",
                             "--timeout", "2s", "http://127.0.0.1:18082/"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.skipif(not shutil.which("wrk"), reason="needs wrk")
def test_a_proxy_driven_into_its_cap_twice_gives_two_episodes_that_start_and_end_with_the_load(
        tmp_path, no_other_haproxy):
    """The issue's shape, shortened for CI: 2 s windows (the issue's are 10 s), the cap held 10 s twice
    with 12 s of quiet between (its: ~30 s twice within 5 minutes). Each episode is haproxy-maxconn and
    starts and ends within one window of the load (a window that straddles an edge may go either way)."""
    cfg = tmp_path / "busy.cfg"
    cfg.write_text(BUSY_CONFIG)
    hp = subprocess.Popen(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec haproxy -db -f "$1"', "sh",
                           str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_exec(hp, "haproxy")
    state, window, edges, w = tmp_path / "state", 2.0, [], None
    prom = tmp_path / "watch.prom"
    try:
        w = subprocess.Popen([*proxytune_argv(), "--state-dir", str(state), "watch", "--pid", str(hp.pid),
                              "--window", str(window), "--no-perf", "--max-size", "1M", "--textfile", str(prom)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert wait_for(lambda: len(recorder.read(state / "watch").records) >= 2, timeout=120), _tail(w)
        for _ in range(2):
            time.sleep(6)
            start = time.time()
            load = busy(hp, 10)
            load.wait(timeout=60)
            edges.append((start, time.time()))
        time.sleep(3 * window)
        w.send_signal(signal.SIGINT)
        _, err = w.communicate(timeout=60)
        assert w.returncode == 130, err
    finally:
        if w:
            stop(w)
        stop(hp)
    r = proxytune("--state-dir", str(state), "watch", "history", "--json")
    eps = [e for e in json.loads(r.stdout)["data"]["episodes"] if e["severity"] in ("high", "medium")]
    recs = recorder.read(state / "watch").records
    seen = [(round(x["t0"] - edges[0][0], 1), [f["id"] for f in x["findings"]]) for x in recs]
    assert [e["finding"] for e in eps] == ["haproxy-maxconn", "haproxy-maxconn"], seen
    for e, (on, off) in zip(eps, edges):
        assert abs(e["start"] - on) <= window + 1.0 and abs(e["end"] - off) <= window + 1.0, (e, on, off, seen)
    assert sum(x["status"] == "failed" for x in recs) == 0, [x.get("reason") for x in recs]
    _keep_evidence(state, prom)
    _metrics_say_the_same(prom.read_text(), recs, seen)


def _metrics_say_the_same(text: str, recs: list[dict], seen) -> None:
    """The textfile as node_exporter's consumer (prometheus_client's parser) reads it: the episodes
    counted, every window counted by its status, and the maxconn cap among its cap series."""
    from prometheus_client.parser import text_string_to_metric_families
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    assert [v for _, v in samples["proxytune_watch_episodes_total"]][0] >= 2, (text, seen)
    by_status = {lab["status"]: v for lab, v in samples["proxytune_watch_windows_total"]}
    assert by_status.get("watched", 0) >= sum(r["status"] == "watched" for r in recs) - 1, (by_status, seen)
    caps = {lab["cap"]: v for lab, v in samples.get("proxytune_watch_cap_limit", [])}
    assert any("maxconn" in c and v == 50 for c, v in caps.items()), caps


def _keep_evidence(state, prom) -> None:
    """PROXYTUNE_WATCH_EVIDENCE=DIR keeps what an operator would see (history, the metrics file)."""
    import os
    from pathlib import Path
    keep = os.environ.get("PROXYTUNE_WATCH_EVIDENCE")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        r = proxytune("--state-dir", str(state), "watch", "history")
        (Path(keep) / "history.txt").write_text(r.stdout)
        (Path(keep) / "watch.prom").write_text(prom.read_text())


FULL_STATE = """
import json, os, signal, subprocess, sys, time
mnt, argv, pid = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "pt-watch-full", mnt], check=True)
ring = os.path.join(mnt, "watch")
w = subprocess.Popen([*argv, "--state-dir", mnt, "watch", "--pid", pid, "--window", "1", "--no-perf",
                      "--max-size", "256K"], stderr=subprocess.PIPE, text=True)
def segs():
    try:
        return sum(os.path.getsize(os.path.join(ring, n)) for n in os.listdir(ring) if n.endswith(".seg"))
    except OSError:
        return 0
def wait(cond, s):
    end = time.monotonic() + s
    while not cond() and time.monotonic() < end:
        time.sleep(0.2)
    return cond()
out = {"first": wait(lambda: segs() > 0, 120)}
try:
    with open(os.path.join(mnt, "fill"), "wb", buffering=0) as f:     # every byte left, as another writer takes it
        while True:
            f.write(b"x" * 4096)
except OSError as e:
    out["fill"] = e.strerror
full_at = segs()
time.sleep(5)
out["grew_while_full"] = segs() - full_at
os.unlink(os.path.join(mnt, "fill"))
out["again"] = wait(lambda: segs() > full_at, 60)
w.send_signal(signal.SIGINT)
out["err"] = w.communicate(timeout=60)[1]
out["rc"] = w.returncode
print(json.dumps(out))
"""


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare")
def test_a_full_state_filesystem_is_said_once_and_the_watch_goes_on(tmp_path, no_other_haproxy):
    """The real watcher on a 1 MiB tmpfs (a private mount namespace's: gone with it) that another writer
    fills: it says so once and keeps watching, and records again once there is room."""
    hp = start_haproxy(tmp_path)
    mnt = tmp_path / "state"
    mnt.mkdir()
    try:
        p = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", FULL_STATE, str(mnt),
                            json.dumps(proxytune_argv()), str(hp.pid)], capture_output=True, text=True, timeout=300)
    finally:
        stop(hp)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    err = out["err"]
    assert out["first"] and out["fill"] == "No space left on device", out
    assert out["grew_while_full"] <= 0 and out["again"], out
    assert err.count("still watching, windows are not kept until it has room") == 1, err
    assert "recording again (" in err and out["rc"] == 130 and "Traceback" not in err, err
    assert list(mnt.iterdir()) == []                  # the namespace's mount never reached the host

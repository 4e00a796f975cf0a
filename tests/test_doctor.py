"""doctor against real programs on this machine, no mocks: each workload
has one known problem and the doctor must name it (and, where it says so,
not name the others). Every program here stops by itself within its time
budget; the doctor's tracers must be gone when it returns or is interrupted.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import IS_ROOT, REPO, proxytune

pytestmark = pytest.mark.skipif(not (IS_ROOT and shutil.which("bpftrace") and shutil.which("perf")),
                                reason="needs root, bpftrace and perf")
SERVERS = REPO / "tests" / "servers"
WINDOW = "4"
RUN_TMP = Path(tempfile.mkdtemp(prefix="ptdoctor-"))     # the doctor's TMPDIR: its run dirs land here only


@pytest.fixture(scope="module", autouse=True)
def _remove_run_tmp():
    yield
    shutil.rmtree(RUN_TMP, ignore_errors=True)


@pytest.fixture(scope="module")
def loopserver(tmp_path_factory):
    exe = tmp_path_factory.mktemp("bin") / "loopserver"
    subprocess.run(["cc", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-o", str(exe), str(SERVERS / "loopserver.c")],
                   check=True)
    return exe


def start(argv, **kw) -> tuple[subprocess.Popen, int]:
    """Start a workload that prints 'ready PID'; return it and the pid to diagnose."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    line = p.stdout.readline()
    assert line.startswith("ready "), f"workload did not start: {line!r} {p.stderr.read() if p.poll() else ''}"
    return p, int(line.split()[1])


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
    try:
        p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def diagnose(argv: list[str]) -> dict:
    """Start a workload, run the doctor on it, stop it."""
    p, pid = start(argv)
    try:
        return doctor(pid)
    finally:
        stop(p)


def doctor(pid: int, *extra) -> dict:
    r = proxytune("doctor", "--pid", str(pid), "--duration", WINDOW, "--json", *extra, timeout=180,
                  env={"TMPDIR": str(RUN_TMP)})
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert r.returncode == (1 if doc["findings"] else 0)
    assert no_tracers_left()
    print(json.dumps({f["id"]: f["evidence"] for f in doc["findings"]}, default=str))   # shown with pytest -s
    return doc


def by_id(doc: dict) -> dict:
    return {f["id"]: f for f in doc["findings"]}


def no_tracers_left() -> bool:
    """No tracer of ours runs and our private TMPDIR is empty (other runs on the machine do not count)."""
    out = subprocess.run(["pgrep", "-af", str(RUN_TMP)], capture_output=True, text=True).stdout
    return out.strip() == "" and not any(RUN_TMP.iterdir())


def test_poll_loop_over_idle_connections_is_poll_scan_and_names_its_scan_function(loopserver):
    doc = diagnose([str(loopserver), "--mode", "poll", "--idle", "3000", "--busy", "4", "--seconds", "40"])
    f = by_id(doc)
    seen = doc["data"]["evidence"]
    polls = {k: v for k, v in seen["bpf"].items() if k.startswith("@poll") and k != "@poll_nfds_hist"}
    assert "poll-scan" in f, (doc["findings"], polls, seen.get("bpf_window_s"), seen.get("bpftrace_stderr", "")[-500:])
    ev = f["poll-scan"]["evidence"]
    assert ev["mean_nfds"] >= 3000 and ev["mean_ready"] <= 10
    assert f["cpu-hotspot"]["evidence"]["function"] == "comm_select"
    assert "blocking-disk-io" not in f
    assert set(doc) >= {"schema", "kind", "host", "data", "findings"}
    for x in doc["findings"]:
        assert set(x) >= {"id", "severity", "evidence", "fix"} and x["fix"]


def test_fsync_in_the_event_loop_is_blocking_disk_io(loopserver, tmp_path):
    doc = diagnose([str(loopserver), "--mode", "fsync", "--idle", "10", "--busy", "4", "--seconds", "40",
                    "--log", str(tmp_path / "log")])
    f = by_id(doc)
    assert "blocking-disk-io" in f, doc["findings"]
    assert f["blocking-disk-io"]["evidence"]["fsync_calls"] > 100
    assert "poll-scan" not in f                     # it uses epoll


def test_client_with_ten_ports_is_ephemeral_port_exhaustion():
    doc = diagnose(["unshare", "-n", sys.executable, str(SERVERS / "portclient.py"), "--seconds", "40"])
    f = by_id(doc)
    assert "ephemeral-port-exhaustion" in f, doc["findings"]
    ev = f["ephemeral-port-exhaustion"]["evidence"]
    assert ev["eaddrnotavail"] > 10 and ev["port_range"] == "40000 40009"


def wrk_background(url: str, seconds: int, connections: int, script: Path | None = None) -> subprocess.Popen:
    argv = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s"] + (["-s", str(script)] if script else []) + [url]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.skipif(not (shutil.which("wrk") and Path("/usr/sbin/nginx").exists()), reason="needs nginx and wrk")
def test_nginx_with_a_low_worker_rlimit_nofile_is_fd_exhaustion():
    from proxytune.microbench import servers
    with servers.Nginx(workers=1, rlimit_nofile=64) as ng:
        load = wrk_background(f"http://127.0.0.1:{ng.port}/", 300, 300)     # outlives the doctor; stopped below
        try:
            time.sleep(1)
            doc = doctor(ng.pid)
        finally:
            stop(load)
        log = ng.error_log()
    f = by_id(doc)
    assert "fd-exhaustion" in f, doc["findings"]
    errors, ev = f["fd-exhaustion"]["evidence"]["errors"], doc["data"]["evidence"]
    assert errors.get("accept4 EMFILE", 0) > 0, (ev["scripts"], ev["triage"])
    assert "Too many open files" in log                # nginx saw the same thing
    assert doc["data"]["target"]["pids"][0] == ng.pid and len(doc["data"]["target"]["pids"]) == 2   # master + worker


MISS_LUA = """local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "http://127.0.0.1:%d/o/" .. math.random(1000000000) .. "/" .. n)
end
"""


@pytest.mark.skipif(not (shutil.which("wrk") and Path("/usr/sbin/squid").exists()), reason="needs squid and wrk")
def test_squid_ufs_under_cache_misses_is_file_per_object_churn(tmp_path):
    from proxytune.microbench import servers
    with servers.Nginx(workers=1) as origin, servers.Squid("ufs", cache_mb=200) as squid:
        lua = tmp_path / "miss.lua"
        lua.write_text(MISS_LUA % origin.port)
        load = wrk_background(f"http://127.0.0.1:{squid.port}/", 300, 20, lua)
        try:
            time.sleep(1)
            doc = doctor(squid.pid)
        finally:
            stop(load)
        cache, st = str(squid.cache), os.stat(squid.cache).st_dev
    f = by_id(doc)
    assert "file-per-object-churn" in f, doc["findings"]
    ev = f["file-per-object-churn"]["evidence"]
    assert ev["creates_per_s"] > 50
    # counted at ext4 by device (MAJ:MIN) without --deep, by path with it
    assert max(ev["devices"], key=ev["devices"].get) == f"{os.major(st)}:{os.minor(st)}", (ev, cache)
    assert "cache-dir-atime" in f or any(d["atime"] == "noatime" for d in doc["data"]["evidence"]["cache_dirs"])


def test_ctrl_c_reaps_every_tracer(loopserver):
    p, pid = start([str(loopserver), "--mode", "poll", "--idle", "100", "--seconds", "40"])
    try:
        d = subprocess.Popen([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "doctor", "--pid", str(pid),
                              "--duration", "30", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "TMPDIR": str(RUN_TMP)})
        deadline = time.monotonic() + 30
        while no_tracers_left() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not no_tracers_left(), "the doctor never started its tracers"
        time.sleep(1)
        d.send_signal(signal.SIGINT)
        d.wait(timeout=30)
        assert d.returncode == 130
        time.sleep(0.5)
        assert no_tracers_left()
        assert p.poll() is None                   # the target was not harmed
    finally:
        stop(p)

"""The audit of a running proxy: its real nofile limit and fd use, its listen
backlog from ss, its cache directory's atime mode. The 'proxy' is a real
process the test spawns under a name of its own."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import proxytune

LIVE = {"PROXYTUNE_ROOT": "/"}      # the running processes are read on the live host only, never under --root

SERVER = """
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(7)
held = [open("/dev/null") for _ in range(int(sys.argv[1]))]
print(s.getsockname()[1], flush=True)
time.sleep(60)
"""


@pytest.fixture
def fake_proxy(tmp_path):
    exe = tmp_path / "ptobsproxy"
    shutil.copy(Path(sys.executable).resolve(), exe)
    procs = []

    def start(nofile: str, fds: int):
        p = subprocess.Popen(["prlimit", f"--nofile={nofile}", str(exe), "-c", SERVER, str(fds)],
                             stdout=subprocess.PIPE, text=True)
        port = int(p.stdout.readline())
        procs.append(p)
        return p, port
    yield exe.name, start
    for p in procs:
        p.kill()
        p.wait()


def test_audit_reports_limits_fd_use_and_backlog(sandbox, fake_proxy):
    name, start = fake_proxy
    proc, port = start("64:4096", 50)
    r = proxytune("tune", "check", "--service", name, "--only", "rlimit:*", "--json", env=LIVE)
    obs = json.loads(r.stdout)["data"]["observations"]
    assert obs["running"]
    (p,) = obs["processes"]
    assert (p["pid"], p["nofile_soft"], p["nofile_hard"]) == (proc.pid, 64, 4096)
    assert p["fds_open"] >= 50 and p["status"] == "warn" and "fd exhaustion" in p["note"]
    (sock,) = obs["listeners"]
    assert sock["local"].endswith(f":{port}") and sock["backlog"] == 7
    assert r.returncode == 1    # drift (64 < 65536) and a warning


def test_audit_flags_a_low_limit_with_few_fds(sandbox, fake_proxy):
    name, start = fake_proxy
    start("1024:4096", 0)
    obs = json.loads(proxytune("tune", "check", "--service", name, "--json", env=LIVE).stdout)["data"]["observations"]
    assert obs["processes"][0]["status"] == "warn" and "is low" in obs["processes"][0]["note"]


def test_audit_reads_the_cache_dir_atime_mode(sandbox, loop_ext4):
    _, mnt = loop_ext4
    obs = json.loads(proxytune("tune", "check", "--cache-dir", str(mnt), "--json").stdout)["data"]["observations"]
    (d,) = obs["cache_dirs"]
    assert (d["mountpoint"], d["atime"], d["status"]) == (str(mnt), "relatime", "warn")


def test_a_listener_is_the_proxys_by_its_socket_not_by_a_name_that_says_pid(sandbox, fake_proxy, tmp_path):
    """`ss -p` prints each owner's name inside its line: a process named `x",pid=PROXY,fd=3))` made its own
    listener the proxy's. Owners are now found by socket inode."""
    name, start = fake_proxy
    proc, _ = start("4096:4096", 0)
    liar = tmp_path / f'x",pid={proc.pid},fd=3))'
    shutil.copy(Path(sys.executable).resolve(), liar)
    other = subprocess.Popen([str(liar), "-c", SERVER, "0"], stdout=subprocess.PIPE, text=True)
    try:
        other_port = int(other.stdout.readline())
        obs = json.loads(proxytune("tune", "check", "--service", name, "--json", env=LIVE).stdout)["data"]["observations"]
        assert [s["pids"] for s in obs["listeners"]] == [[proc.pid]]
        assert not any(s["local"].endswith(f":{other_port}") for s in obs["listeners"])
    finally:
        other.kill()
        other.wait()

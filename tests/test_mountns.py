"""A benchmark's private mount namespace (core/mountns.py): its mounts are never seen on the host,
and what it started dies with it, also when it is SIGKILLed and a server it started has dropped
its privileges (and with them its parent-death signal) and sits in a session of its own."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import IS_ROOT, REPO

pytestmark = pytest.mark.skipif(not IS_ROOT, reason="needs root (unshare, mount)")

CHILD = r"""
import importlib.machinery, importlib.util, subprocess, sys, time
from pathlib import Path
spec = importlib.machinery.ModuleSpec("proxytune", None, is_package=True)
spec.submodule_search_locations = [sys.argv[1]]
sys.modules["proxytune"] = importlib.util.module_from_spec(spec)
from proxytune.core import mountns
where = Path(sys.argv[2])
mountns.private()
mountns.guard()
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], check=True)
# a server that outlives us if nothing kills it: its own session, no parent-death signal, nobody's uid
srv = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sleep", "300"],
                       start_new_session=True, cwd=where)
print(srv.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_sigkilled_benchmark_leaves_no_process_and_no_mount(tmp_path):
    where = tmp_path / "cache"
    where.mkdir()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(REPO), str(where)], stdout=subprocess.PIPE, text=True)
    server = None
    try:
        server = int(child.stdout.readline())
        assert _alive(server)
        assert str(where) not in open("/proc/self/mountinfo").read()          # never on the host
        host_ns = os.readlink("/proc/self/ns/mnt")
        assert os.readlink(f"/proc/{server}/ns/mnt") != host_ns               # it is in the private one
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        deadline = time.monotonic() + 10          # the guard wakes on the parent-death signal: ms, not s
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(server), "the server outlived the benchmark that started it"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if server and _alive(server):
            os.kill(server, signal.SIGKILL)

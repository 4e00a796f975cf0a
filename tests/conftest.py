"""Shared fixtures: a sandboxed Host (temp root and journal), a CLI runner,
and helpers for the sandboxes the tests make (network namespaces, loop mounts).
Nothing here touches the real /etc or /var/lib/proxytune."""

import atexit
import importlib.machinery
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
if "proxytune" not in sys.modules:      # the checkout is the `proxytune` package (as cli.py does)
    _spec = importlib.machinery.ModuleSpec("proxytune", None, is_package=True)
    _spec.submodule_search_locations = [str(REPO)]
    sys.modules["proxytune"] = importlib.util.module_from_spec(_spec)
# Harnesses build with -Werror here (never for users), into the checkout's own
# cache rather than ~/.cache or /var/cache; subprocesses inherit both.
os.environ.setdefault("PROXYTUNE_WERROR", "1")
os.environ.setdefault("PROXYTUNE_CACHE_DIR", str(REPO / "microbench" / "build"))
# The host-wide apply lock (/run/proxytune) and the journal/syslog lines of apply and rollback
# stay in this session's temp dir, whatever a test forgets: nothing reaches the real /run or log.
_SESSION_RUN = tempfile.mkdtemp(prefix="pt-test-run-")
atexit.register(shutil.rmtree, _SESSION_RUN, True)
for _var, _name in (("PROXYTUNE_LOCK_DIR", "lock"), ("PROXYTUNE_JOURNAL_SOCKET", "no-journal"),
                    ("PROXYTUNE_SYSLOG_SOCKET", "no-syslog")):
    os.environ.setdefault(_var, os.path.join(_SESSION_RUN, _name))

from proxytune.tune.host import Host  # noqa: E402
from proxytune.tune.fleet_play import code_tops  # noqa: E402

import tiers  # noqa: E402
from tiers import pytest_runtest_protocol  # noqa: E402,F401  (a hook: make test-fast's no-program guard)

tiers.guard_fast_tier()


def pytest_collection_modifyitems(config, items):
    """Every test gets its tiers (host, proxy, slow) from the gates and fixtures it uses: tests/tiers.py."""
    tiers.mark(items)

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (network namespaces, loop devices, prlimit)")


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A temp root for /etc files, a temp journal and host lock, also for subprocesses via env."""
    root = tmp_path / "root"
    state = tmp_path / "state"
    (root / "etc").mkdir(parents=True)
    monkeypatch.setenv("PROXYTUNE_ROOT", str(root))
    monkeypatch.setenv("PROXYTUNE_STATE_DIR", str(state))
    monkeypatch.setenv("PROXYTUNE_LOCK_DIR", str(tmp_path / "run"))
    return Host(root=root, state_dir=state, lock_dir=tmp_path / "run")


@pytest.fixture
def cli():
    from proxytune.cli import main

    def run(*args, input=None):
        return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)
    return run


# The CLI as tests run it: cli.py itself, with a fault seam the crash-safety tests use
# (PROXYTUNE_FAULT_AFTER_STEP; tests/faulty_cli.py). The product has no fault switch.
CLI = REPO / "tests" / "faulty_cli.py"


# Every CLI a test starts inherits the suite's signal dispositions. Started in the background by
# a script (SIGINT ignored) or under nohup (SIGHUP ignored), the CLIs would rightly keep them
# ignored (core/signals.py), and the Ctrl-C and hangup tests would test nothing. A handler that
# does nothing keeps the suite itself as its launcher asked (nohup make test survives the hangup),
# while exec resets a caught signal to the default in every child: a terminal's SIGINT and SIGHUP.
def _as_launched(signum, frame):
    pass


for _sig in (signal.SIGINT, signal.SIGHUP):
    if signal.getsignal(_sig) is signal.SIG_IGN:
        signal.signal(_sig, _as_launched)


def wait_for(pred, timeout: float = 60.0, every: float = 0.1) -> bool:
    """Poll pred until it holds (True) or timeout passes (False): wait for the event, not a time."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every)
    return False


def wait_exec(p: subprocess.Popen, comm: str, timeout: float = 30) -> None:
    """Until the child (started through a wrapper such as prlimit) runs `comm`: a fixed sleep
    can end while the wrapper is still there, with its limits and name."""
    def running() -> bool:
        try:
            return Path(f"/proc/{p.pid}/comm").read_text().strip() == comm
        except FileNotFoundError:
            return False
    if not wait_for(running, timeout, every=0.02):
        raise AssertionError(f"pid {p.pid} did not exec {comm} within {timeout:g} s")


def proxytune(*args, env=None, netns=False, check=False, timeout=120):
    """Run ./proxytune as a real process, optionally in a fresh network namespace."""
    argv = [str(REPO / ".venv/bin/python"), str(CLI), *args]
    if netns:
        argv = ["unshare", "-n", *argv]
    return subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=timeout, check=check)


def net_sysctls() -> dict:
    """Every net.core and net.ipv4 sysctl of this namespace (a test's check that nothing changed)."""
    out = {}
    for d in ("core", "ipv4"):
        for f in Path("/proc/sys/net", d).iterdir():
            try:
                out[f"{d}/{f.name}"] = f.read_text()
            except OSError:        # write-only (route flush) or not readable
                pass
    return out


@pytest.fixture(scope="session")
def default_report(tmp_path_factory):
    """One default `proxytune report`, run as a user runs it (a real process, its own root, state and
    lock dirs), shared by the tests that read its parts (tests/test_cli.py, tests/test_hostsettings.py):
    it takes minutes, and each test reads a different part. The host's net.* around it come along."""
    import types
    base = tmp_path_factory.mktemp("default-report")
    root = base / "root"
    (root / "etc").mkdir(parents=True)
    env = {"PROXYTUNE_ROOT": str(root), "PROXYTUNE_STATE_DIR": str(base / "state"),
           "PROXYTUNE_LOCK_DIR": str(base / "run")}
    before = net_sysctls()
    run = proxytune("report", "-o", str(base / "out"), env=env, timeout=1800)
    return types.SimpleNamespace(run=run, out=base / "out", root=root, state=base / "state", net_before=before,
                                 net_after=net_sysctls())


def in_netns(script: str, env=None) -> subprocess.CompletedProcess:
    """Run a bash script in a new network namespace (net.* sysctls are private there)."""
    return subprocess.run(["unshare", "-n", "bash", "-euo", "pipefail", "-c", script], capture_output=True,
                          text=True, env={**os.environ, "PT": f"{REPO}/.venv/bin/python {CLI}", **(env or {})},
                          timeout=300)


@pytest.fixture
def loop_ext4(tmp_path):
    """A loop-mounted ext4 image mounted relatime; unmounted (and the loop freed) afterwards."""
    if not IS_ROOT or not shutil.which("mkfs.ext4"):
        pytest.skip("needs root and mkfs.ext4")
    img, mnt = tmp_path / "cache.img", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "32M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    subprocess.run(["mount", "-o", "loop,relatime", str(img), str(mnt)], check=True)
    try:
        yield img, mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


@pytest.fixture(scope="module")
def as_nobody():
    """run(*args, env=None): proxytune as the unprivileged user nobody (setpriv), from a
    world-readable copy of the package (no launcher: as installed) run by Debian's python3.
    run.scratch: a directory nobody owns, for its own --root and --state-dir."""
    if not IS_ROOT or not shutil.which("setpriv"):
        pytest.skip("needs root to switch to nobody")
    if subprocess.run(["/usr/bin/python3", "-c", "import click, rich, jsonschema"], capture_output=True).returncode:
        pytest.skip("needs Debian's python3-click, python3-rich and python3-jsonschema")
    top = Path(tempfile.mkdtemp(prefix="pt-nobody-"))    # under /tmp: pytest's own temp dir is root-only
    try:
        copy = top / "copy"
        copy.mkdir()
        for part in code_tops(REPO):          # what a fleet bundle ships: every package, found by its __init__.py
            src = REPO / part
            (shutil.copytree(src, copy / part, ignore=shutil.ignore_patterns("build", "__pycache__"))
             if src.is_dir() else shutil.copy(src, copy / part))
        subprocess.run(["chmod", "-R", "a+rX", str(top)], check=True)
        (top / "scratch").mkdir()
        shutil.chown(top / "scratch", "nobody", "nogroup")

        def run(*args, env=None, timeout=120):
            environment = {**os.environ, "HOME": "/nonexistent", "COLUMNS": "400", **(env or {})}
            return subprocess.run([*NOBODY, "/usr/bin/python3", str(copy / "cli.py"), *args], capture_output=True,
                                  text=True, cwd=copy, env=environment, timeout=timeout)
        run.scratch = top / "scratch"
        yield run
    finally:
        shutil.rmtree(top, ignore_errors=True)

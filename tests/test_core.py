"""core/: the one place for errors, console, /proc readers, process groups
and the capability type; it depends on none of the packages built on it."""

import ast
import os
import resource
import signal
import subprocess
import sys
import time

from conftest import REPO
from proxytune.core import procfs, procgroup
from proxytune.core.capability import Capability, no, perf_counts, yes

PACKAGES = ("proxies", "tune", "probes", "microbench", "reports", "commands", "cli")


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def test_core_imports_none_of_the_packages_built_on_it():
    for path in (REPO / "core").glob("*.py"):
        bad = [m for m in _imports(path) if m.split(".")[0] in PACKAGES
               or m.startswith(tuple(f"proxytune.{p}" for p in PACKAGES))]
        assert not bad, (path.name, bad)


def test_moved_modules_left_no_shims_behind():
    for old in ("tune/errors.py", "tune/procs.py", "probes/tempdir.py", "probes/children.py"):
        assert not (REPO / old).exists(), old


def test_microbench_probes_and_tune_do_not_import_reports():
    for pkg in ("microbench", "probes", "tune", "core"):
        for path in (REPO / pkg).rglob("*.py"):
            bad = [m for m in _imports(path) if m.startswith("proxytune.reports") or m.startswith("reports")]
            assert not bad, (str(path.relative_to(REPO)), bad)


def test_capability_result_keeps_the_json_shape():
    assert no("perf is missing").to_result() == {"available": False, "reason": "perf is missing"}
    assert yes("ok").to_result(command="x") == {"available": True, "reason": "ok", "command": "x"}
    assert Capability(False, "r") == no("r")


def test_perf_counts_says_why_when_perf_is_missing(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    c = perf_counts("L1-dcache-load-misses")
    assert not c.ok and "not installed" in c.why


def test_read_stat_survives_a_hostile_comm_and_sees_recycling():
    """A comm with ') (' and spaces must not shift the fields; identity is pid + start time."""
    p = subprocess.Popen([sys.executable, "-c", "import ctypes,time; "
                          "ctypes.CDLL(None).prctl(15, b') x (R 1 ', 0, 0, 0); time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while procfs.comm_of(p.pid) != ") x (R 1 " and time.monotonic() < deadline:
            time.sleep(0.05)
        st = procfs.read_stat(p.pid)
        assert st.comm == ") x (R 1 " and st.ppid == os.getpid() and st.state in ("S", "R")
        assert procfs.identity(p.pid) == {"pid": p.pid, "start": st.start, "comm": st.comm}
        assert procfs.same_process(procfs.identity(p.pid))
        assert not procfs.same_process({**procfs.identity(p.pid), "start": st.start + 1})
        assert p.pid in procfs.descendants(os.getpid())
        assert p.pid in procfs.pids_of(") x (R 1 ")
    finally:
        p.kill()
        p.wait()
    assert procfs.read_stat(p.pid) is None and procfs.identity(p.pid) is None
    assert procfs.fd_count(p.pid) is None and procfs.nofile_limits(p.pid) is None


def test_nofile_limits_and_fd_count_match_this_process():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    conv = lambda v: "unlimited" if v == resource.RLIM_INFINITY else v
    assert procfs.nofile_limits(os.getpid()) == (conv(soft), conv(hard))
    assert procfs.fd_count(os.getpid()) == len(os.listdir("/proc/self/fd")) - 1 or \
        procfs.fd_count(os.getpid()) == len(os.listdir("/proc/self/fd"))
    assert procfs.cpu_seconds(os.getpid()) > 0
    assert abs(procfs.started_at(os.getpid()) - time.time()) < 24 * 3600


def test_bad_pids_read_as_gone():
    for pid in (-1, 0, "1; rm -rf /", 2 ** 40):
        assert procfs.read_stat(pid) is None and procfs.identity(pid) is None


def test_a_tsv_cell_with_a_line_separator_or_bidi_override_stays_one_cell():
    """splitlines() (and some terminals) break at U+2028 and reorder at U+202E: a hostile
    process name in a cell must not forge a second row."""
    from rich.table import Table
    from proxytune.core.console import tsv_lines
    t = Table(title="t")
    t.add_column("comm")
    t.add_column("status")
    t.add_row("evil\u2028squid\tmet", "a\u202eb\x85c\r\nd")
    lines = tsv_lines(t)
    assert lines == ["# t", "comm\tstatus", "evil squid met\ta b c d"]
    assert "\n".join(lines).splitlines() == lines


def test_uid_and_write_bytes_of_this_process():
    assert procfs.uid_of(os.getpid()) == os.getuid()
    io = procfs.write_bytes(os.getpid())
    assert io is None or io >= 0
    assert procfs.uid_of(2 ** 40) is None and procfs.write_bytes(2 ** 40) is None


def test_run_time_and_context_switches_of_this_process_grow():
    t0, s0 = procfs.run_seconds(os.getpid()), procfs.context_switches(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    time.sleep(0.01)                                   # one voluntary switch at least
    assert procfs.run_seconds(os.getpid()) - t0 >= 0.04
    assert procfs.context_switches(os.getpid()) > s0
    assert procfs.run_seconds(2 ** 40) is None and procfs.context_switches(2 ** 40) == 0


STOPPABLE = r"""
import os, signal, sys, time
seen = []
signal.signal(signal.SIGINT, lambda s, f: seen.append("INT"))
signal.signal(signal.SIGTERM, lambda s, f: seen.append("TERM"))
print("ready", flush=True)
while not (sys.argv[1] == "term" and "TERM" in seen or sys.argv[1] == "int" and seen):
    time.sleep(0.02)
time.sleep(0.6)                     # any signal sent meanwhile is counted too
print(" ".join(seen), flush=True)
os._exit(0)                         # Python's shutdown resets the handlers: a nudge then would kill it
"""


def _stoppable(mode: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", STOPPABLE, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    assert p.stdout.readline() == "ready\n"
    return p


def test_stop_sends_one_sigint_unless_asked_to_nudge():
    """perf gets exactly one SIGINT; a tracer that ignores it gets the nudge signal until it exits."""
    p = _stoppable("int")
    out, _ = procgroup.stop(p, grace=30)
    assert (out.strip(), p.returncode) == ("INT", 0)
    p = _stoppable("term")
    out, _ = procgroup.stop(p, grace=30, nudge=(signal.SIGTERM, 0.1))
    assert out.split()[:2] == ["INT", "TERM"] and "INT" not in out.split()[1:] and p.returncode == 0


def test_stop_kills_after_the_grace_and_returns_at_once_for_an_exited_child():
    p = _stoppable("term")                          # never sent SIGTERM: killed when the grace ends
    procgroup.stop(p, grace=0.5)
    assert p.returncode == -signal.SIGKILL
    p = subprocess.Popen([sys.executable, "-c", "print('done')"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    p.wait()
    assert procgroup.stop(p, grace=0, nudge=(signal.SIGTERM, 0.1)) == ("done\n", "")

"""The report's progress: one plain line per section when piped, a live table on a terminal,
and a private network namespace for what it runs there."""

import io
import os
import socket
import time

import pytest

from conftest import needs_root
from proxytune.core import netns
from proxytune.core.errors import ProxytuneError
from proxytune.reports.progress import Sections

PLAN = [("audit", "host audit", 3), ("events", "event mechanisms", 10), ("storage", "object stores", 20)]


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_piped_progress_is_one_plain_line_per_section_as_it_finishes():
    out = io.StringIO()
    with Sections(PLAN, stream=out) as s:
        s.begin("audit")
        s.end("audit", "done")
        first = out.getvalue()
        s.begin("events")
        s.end("events", "done")
        s.begin("storage")
        s.end("storage", "bench storage needs root")
    lines = out.getvalue().splitlines()
    assert first.startswith("proxytune: [1/3] host audit: done in ") and first.count("\n") == 1
    assert lines[1].startswith("proxytune: [2/3] event mechanisms: done in ")
    assert lines[2] == "proxytune: [3/3] object stores: not run: bench storage needs root"
    assert "\x1b" not in out.getvalue()                   # no escape codes in a pipe


def test_the_estimate_is_the_budgets_left_and_never_negative():
    s = Sections(PLAN, quiet=True)
    assert s.remaining() == 33
    s.begin("audit")
    s.started -= 10                                      # the audit overran its 3 s budget
    assert s.remaining() == 30
    s.end("audit", "done")
    s.begin("events")
    s.started -= 4
    assert 25.5 < s.remaining() < 26.5


def test_a_terminal_gets_a_live_table_of_done_running_and_left():
    out = _Tty()
    with Sections(PLAN, stream=out) as s:
        s.begin("audit")
        s.end("audit", "done")
        s.begin("events")
        s.on_step("idle poll 10000", 3, 12)
        s.live.refresh()
        shown = out.getvalue()
    assert "✓" in shown and "host audit" in shown                       # done, with its time
    assert "▶" in shown and "idle poll 10000 (3/12)" in shown            # running, with its step
    assert "~20 s" in shown and "object stores" in shown                 # left, with its budget
    assert "s left" in shown
    assert not [ln for ln in shown.splitlines() if ln.startswith("proxytune: [")]   # no piped lines


def _interfaces():
    """Asked of the kernel for this process's namespace (sysfs shows the namespace it was mounted in)."""
    return sorted(name for _, name in socket.if_nameindex())


@needs_root
def test_a_private_namespace_has_only_loopback_and_the_host_keeps_its_own():
    host = _interfaces()
    assert netns.call(_interfaces) == ["lo"]
    assert _interfaces() == host


def _fails():
    raise ProxytuneError("no squid here")


@needs_root
def test_an_error_in_the_namespace_comes_back_as_one_line():
    with pytest.raises(ProxytuneError, match="in a private network namespace: no squid here"):
        netns.call(_fails)


CTRL_C_CHILD = r"""
import sys, time, importlib.machinery, importlib.util
from pathlib import Path
sys.path.insert(0, sys.argv[1])
spec = importlib.machinery.ModuleSpec("proxytune", None, is_package=True)
spec.submodule_search_locations = [sys.argv[1]]
sys.modules["proxytune"] = importlib.util.module_from_spec(spec)
from proxytune.core import netns
marks = Path(sys.argv[2])
if sys.argv[3] == "slow":                   # a loaded host: the parent gets to _stop 0.6 s after Ctrl-C
    _stop = netns._stop
    def slow_stop(pid):
        time.sleep(0.6)
        _stop(pid)
    netns._stop = slow_stop

def work():
    try:
        (marks / "started").touch()
        time.sleep(60)
    finally:
        time.sleep(1)                       # stopping a server takes a moment
        (marks / "cleaned").touch()

try:
    netns.call(work)
except KeyboardInterrupt:
    sys.exit(130)
"""


@needs_root
@pytest.mark.parametrize("parent", ["quick", "slow"])
def test_ctrl_c_lets_the_namespace_child_clean_up_and_then_stops(tmp_path, parent):
    """A terminal's Ctrl-C reaches the parent and the child (and the parent passes it on): the
    child's cleanup (stopping its Squid) must finish, not be cut short by a second one, also one
    that comes while the parent is on its way from the first into waiting for the child (a parent
    ended there takes the child with it: PR_SET_PDEATHSIG). "slow" holds the parent 0.6 s on that
    way, as a loaded host can (the CI of 3d9f8de lost the cleanup so), and the second Ctrl-C lands there."""
    import signal
    import subprocess
    import sys
    from conftest import REPO
    p = subprocess.Popen([sys.executable, "-c", CTRL_C_CHILD, str(REPO), str(tmp_path), parent],
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "started").exists()
        os.killpg(p.pid, signal.SIGINT)          # as the terminal does: the whole foreground group
        time.sleep(0.3)
        os.killpg(p.pid, signal.SIGINT)          # an impatient second Ctrl-C, during the cleanup
        assert p.wait(timeout=30) == 130
        assert (tmp_path / "cleaned").exists()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)

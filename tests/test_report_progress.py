"""The report's progress: one plain line per section when piped, a live table on a terminal,
and a private network namespace for what it runs there."""

import io
import socket

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

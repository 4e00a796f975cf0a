"""A standing bpftrace program (the watcher's probes, attached once): it prints and clears its output
maps every window, so each dump is one window's counts, and keeps its bookkeeping maps (a thread's
start time) across windows. Composing, the output maps and the reader are checked without bpftrace;
one live test counts a known number of calls per window."""

import io
import os
import re
import shutil
import threading
import time

import pytest

from conftest import IS_ROOT
from proxytune.core import procgroup
from proxytune.core.errors import ProxytuneError
from proxytune.probes import bpftrace

needs_bpftrace = pytest.mark.skipif(not (IS_ROOT and shutil.which("bpftrace")), reason="needs root and bpftrace")


def test_output_maps_are_what_bpftrace_prints_at_exit_less_each_scripts_bookkeeping():
    cat = bpftrace.catalog()
    for s in cat.values():
        ends = [m.strip() for m in bpftrace.END_RE.findall(s.text)]
        outs = bpftrace.output_maps(bpftrace.END_RE.sub("", s.text), ends)
        assert outs, s.name
        cleared = {m for e in ends for m in bpftrace.CLEARED.findall(e)}
        assert not cleared & set(outs), s.name
    pollscan = cat["pollscan"]
    outs = bpftrace.output_maps(bpftrace.END_RE.sub("", pollscan.text), ["clear(@poll_n); clear(@poll_t0);"])
    assert "@poll_calls" in outs and "@poll_t0" not in outs and "@poll_n" not in outs


def test_a_map_named_in_a_comment_or_a_string_is_no_map():
    body = '/* @not_a_map in a comment */\ntracepoint:a:b { @real = count(); printf("@nor_this\\n"); } // @nor_that'
    assert bpftrace.output_maps(body, []) == ["@real"]


def test_a_standing_program_dumps_and_clears_its_output_maps_every_window():
    cat = bpftrace.catalog()
    prog = bpftrace.compose([cat["pollscan"], cat["fd_errors"]], [11], dump_every_ms=2000)
    dump = next(l for l in prog.splitlines() if l.startswith("interval:ms:2000"))
    assert "print(@poll_calls);" in dump and "clear(@poll_calls);" in dump and "print(@fdok_accept);" in dump
    assert "@poll_t0" not in dump                      # a thread's start time survives the window
    assert bpftrace.WINDOW_MARK in dump
    assert prog.count("END {") == 1 and "clear(@poll_t0)" in prog
    assert "interval:" not in bpftrace.compose([cat["pollscan"]], [11])


class _FakeProc:
    """Stands in for bpftrace's Popen: its stdout and stderr as text, an exit status once they are read."""

    def __init__(self, out: str, err: str = "", rc: int = 0):
        self.stdout, self.stderr, self.rc = io.StringIO(out), io.StringIO(err), rc
        self.returncode = None

    def wait(self, timeout=None):
        self.returncode = self.rc
        return self.rc

    def poll(self):
        return self.returncode


class _FakeRun:
    def __init__(self, proc):
        self.proc, self.started = proc, time.monotonic()


def _mark() -> str:
    return '{"type": "printf", "data": "%s\\n"}\n' % bpftrace.WINDOW_MARK


def test_each_window_is_read_whole_at_its_mark_and_an_exit_is_an_error_not_an_empty_window():
    out = ('{"type": "attached_probes", "data": {"probes": 3}}\n'
           '{"type": "map", "data": {"@poll_calls": 5}}\n' + _mark()
           + '{"type": "map", "data": {"@poll_calls": 0}}\n{"type": "hist", "data": {"@h": []}}\n' + _mark()
           + '{"type": "map", "data": {"@poll_calls": 9}}\n')          # a window cut by the exit
    standing = bpftrace.Standing(_FakeRun(_FakeProc(out, "Lost 3 events\n", rc=-9)))
    first, second = standing.next_window(5), standing.next_window(5)
    assert first["@poll_calls"] == 5 and second["@poll_calls"] == 0 and "@h" in second
    assert first["_window_s"] >= 0 and "Lost 3 events" in second["_stderr"]
    with pytest.raises(ProxytuneError, match="bpftrace exited with -9"):
        standing.next_window(5)
    with pytest.raises(ProxytuneError, match="exited"):            # and stays an error
        standing.next_window(5)


def test_every_output_map_of_the_catalog_adds_so_two_windows_merge_into_one():
    """merge_maps adds counts, sums, hists and stats: an output map made any other way (a plain
    assignment, max(), min(), avg()) could not be merged, and is refused here."""
    for s in bpftrace.catalog().values():
        ends = [m.strip() for m in bpftrace.END_RE.findall(s.text)]
        for m in bpftrace.output_maps(bpftrace.END_RE.sub("", s.text), ends):
            made = re.findall(re.escape(m) + r"(?:\[[^\]]*\])?\s*(=|\+\+|--|\+=|-=)\s*(\w*)", s.text)
            assert made and all(op == "=" and fn in ("count", "sum", "hist", "lhist", "stats") for op, fn in made), \
                (s.name, m, made)


def test_two_windows_merge_by_adding_each_kind_of_map():
    a = {"@n": 2, "@by": {"x": 1}, "@h": [{"min": 1, "max": 1, "count": 1}, {"min": 4, "max": 7, "count": 2}],
         "@st": {"k": {"count": 2, "average": 5, "total": 10}}}
    b = {"@n": 3, "@by": {"x": 4, "y": 1}, "@h": [{"min": 0, "max": 0, "count": 5}, {"min": 4, "max": 7, "count": 1}],
         "@st": {"k": {"count": 1, "average": 20, "total": 20}, "j": {"count": 1, "average": 1, "total": 1}},
         "@only_b": 7}
    m = bpftrace.merge_maps(a, b)
    assert m["@n"] == 5 and m["@by"] == {"x": 5, "y": 1} and m["@only_b"] == 7
    assert m["@h"] == [{"min": 0, "max": 0, "count": 5}, {"min": 1, "max": 1, "count": 1},
                       {"min": 4, "max": 7, "count": 3}]
    assert m["@st"]["k"] == {"count": 3, "average": 10, "total": 30} and m["@st"]["j"]["count"] == 1
    assert a["@n"] == 2 and a["@by"] == {"x": 1}                           # the inputs are left as they were


def test_a_dump_right_after_a_stalled_one_joins_the_next_window():
    """A stall: the dump of 2.1 s comes late, the interval that fired meanwhile 5 ms after it, with
    5 ms of counts; that one is held and added to the next, whose window spans both."""
    out = ('{"type": "map", "data": {"@c": 2100}}\n' + _mark()      # at 2.1 s: the stalled window, whole
           + '{"type": "map", "data": {"@c": 5}}\n' + _mark()      # at 2.105 s: 5 ms of counts
           + '{"type": "map", "data": {"@c": 895}}\n' + _mark())   # at 3.0 s
    times = iter([2.1, 2.105, 3.0])
    run = _FakeRun(_FakeProc(out))
    run.started = 0.0
    standing = bpftrace.Standing(run, interval_s=1.0, clock=lambda: next(times))
    first, second = standing.next_window(5), standing.next_window(5)
    assert first["@c"] == 2100 and first["_window_s"] == pytest.approx(2.1)
    assert second["@c"] == 900 and second["_window_s"] == pytest.approx(0.9)
    with pytest.raises(ProxytuneError, match="exited"):
        standing.next_window(5)


def test_a_held_window_that_cannot_merge_goes_alone_and_a_failed_reader_is_an_exit():
    """A map printed as two shapes (a hist, then a number) cannot be added: the held window is queued
    as it was, with its own span. A reader that fails queues the end, so a poll says it failed
    instead of waiting out its deadline, and says why."""
    out = ('{"type": "map", "data": {"@c": 1}}\n' + _mark()
           + '{"type": "hist", "data": {"@h": [{"min": 1, "max": 1, "count": 2}]}}\n' + _mark()
           + '{"type": "map", "data": {"@h": 3}}\n' + _mark())
    times = iter([1.0, 1.01, 2.0])
    run = _FakeRun(_FakeProc(out))
    run.started = 0.0
    standing = bpftrace.Standing(run, interval_s=1.0, clock=lambda: next(times))
    first, held, last = standing.next_window(5), standing.next_window(5), standing.next_window(5)
    assert first["@c"] == 1 and held["@h"][0]["count"] == 2 and held["_window_s"] == pytest.approx(0.01)
    assert last["@h"] == 3 and last["_window_s"] == pytest.approx(0.99)
    broken = _FakeRun(_FakeProc(_mark()))
    broken.started = 0.0
    standing = bpftrace.Standing(broken, interval_s=1.0, clock=lambda: 1 / 0)
    with pytest.raises(ProxytuneError, match="reading bpftrace's windows failed .ZeroDivisionError"):
        standing.next_window(5)


def test_no_window_by_the_deadline_is_an_error():
    r, w = os.pipe()
    proc = _FakeProc("")
    proc.stdout = os.fdopen(r)
    standing = bpftrace.Standing(_FakeRun(proc))
    try:
        with pytest.raises(ProxytuneError, match="printed no window in 0.2 s"):
            standing.next_window(0.2)
    finally:
        os.close(w)


@needs_bpftrace
def test_live_each_window_counts_its_own_calls_only():
    """A thread of this process makes bursts of 50 getppid calls every 100 ms. The windows tile its calls:
    together they hold what the thread made between the first and the last mark, give or take the bursts at
    the edges, so no window is a running total (cleared between dumps) and none leaves a gap. A window's
    count is not fixed at ~500: when the host stalls bpftrace's user side, its print and clear (async
    actions, done when bpftrace reads its perf buffer) come late and one window holds two seconds of calls
    (CI once saw 500, 500, 1000); its length (_window_s) then says so."""
    me = os.getpid()
    prog = (f"tracepoint:syscalls:sys_enter_getppid /pid == {me}/ {{ @calls = count(); }}\n")
    prog += bpftrace.window_dump(["@calls"], 1000) + "\n"
    done, made = threading.Event(), [0]

    def caller():
        while not done.is_set():
            for _ in range(50):
                os.getppid()
            made[0] += 50
            time.sleep(0.1)

    t = threading.Thread(target=caller, daemon=True)
    with procgroup.Children() as kids:
        run = bpftrace.Run(kids, prog)
        run.wait_attached()
        standing = bpftrace.Standing(run)
        t.start()
        try:
            first = standing.next_window(10)           # the first is cut by the start
            before = made[0]
            windows = [standing.next_window(10) for _ in range(3)]
            after = made[0]
        finally:
            done.set()
            standing.stop()
    counts = [w.get("@calls", 0) for w in windows]
    lengths = [w["_window_s"] for w in windows]
    assert after - before >= 500, (before, after)       # the thread ran (~30 bursts in ~3 s; fewer after a stall)
    assert abs(sum(counts) - (after - before)) <= 150, (counts, before, after)   # 3 bursts at the edges
    assert all(c <= 700 * max(s, 1.0) for c, s in zip(counts, lengths)), (counts, lengths)
    assert first["_window_s"] + sum(lengths) >= 3.5, lengths   # four 1 s intervals since attach: none fires early
    assert run.proc.poll() is not None

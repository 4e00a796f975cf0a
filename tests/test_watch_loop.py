"""The watch loop: one record per window whatever happened, episode edges in the journal, a full disk
said once. The doctor's answers are those the live matrix recorded from real proxies (see
test_watch_episodes.py); only the locator's finding of pids is scripted here."""

import socket
import time
import types

import pytest

from test_watch_episodes import BUSY, HEALTHY, answer
from proxytune.probes import episodes, recorder, watch, windows


class Sessions:
    """Stands in for standing.Session: each window's answer from `looks` (a list, or one callable);
    it notes which sessions were opened (their pids) and closed."""
    def __init__(self, looks, same_program: bool = True):
        self.looks, self.opened, self.closed, self.refreshed = looks, [], 0, 0
        self.same_program = same_program

    def __call__(self, pids, window_s, **kw):
        self.opened.append(pids)
        outer = self

        class S:
            stale = False

            def __init__(self):
                self.pids = pids

            def window(self):
                return outer.looks(pids) if callable(outer.looks) else outer.looks.pop(0)

            def refresh(self):
                outer.refreshed += 1
                self.stale = False
                return outer.same_program

            def close(self):
                outer.closed += 1
        return S()


class Seq:
    """A Locator stand-in: the pids each window finds (the locator has its own real-process test)."""
    def __init__(self, plan):
        self.plan, self.kind, self.what = list(plan), "haproxy", "haproxy"

    def find(self):
        return self.plan.pop(0)


def journal_socket(tmp_path, monkeypatch):
    path = tmp_path / "journal.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.settimeout(0.5)
    monkeypatch.setenv("PROXYTUNE_JOURNAL_SOCKET", str(path))
    return s


def drain(s) -> list[str]:
    out = []
    try:
        while True:
            out.append(s.recv(65536).decode())
    except (TimeoutError, socket.timeout):
        return out


def test_the_loop_records_every_window_and_journals_episode_edges(tmp_path, monkeypatch):
    sessions = Sessions([answer(HEALTHY), answer(BUSY), answer(BUSY), answer(HEALTHY)])
    monkeypatch.setattr(time, "sleep", lambda s: None)
    j, said = journal_socket(tmp_path, monkeypatch), []
    plan = [([10], "watching haproxy master pid 10"), ([10], None), ([], "no haproxy is running; waiting for one"),
            ([11], "haproxy restarted: following its new master pid 11 (was 10)"), ([11], None), ([11], None)]
    with recorder.Recorder(tmp_path / "ring", 1 << 20) as r:
        loop = watch.Loop(r, Seq(plan), 1.0, say=said.append, open_session=sessions)
        loop.forever(windows_max=5)
    recs = recorder.read(tmp_path / "ring").records
    assert sessions.opened == [[10], [11]] and sessions.closed == 1    # attached once per master; the absence detached
    assert [x["status"] for x in recs] == ["watched", "watched", "absent", "watched", "watched"]
    assert [x["seq"] for x in recs] == list(range(5)) and len({x["run"] for x in recs}) == 1
    assert [e["windows"] for e in episodes.fold(recs)] == [1, 1]      # the absent window split them
    lines = drain(j)
    assert [l.split("PROXYTUNE_ACTION=")[1].split("\n")[0] for l in lines] == [
        "watch-episode-start", "watch-episode-end", "watch-episode-start", "watch-episode-end"]
    assert all("PROXYTUNE_FINDING=haproxy-maxconn" in l and "PROXYTUNE_FIX=" in l for l in lines)
    assert "haproxy restarted: following its new master pid 11 (was 10)" in said


def test_a_full_disk_is_said_once_and_the_watch_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    said = []
    with recorder.Recorder(tmp_path / "ring", 1 << 20) as r:
        loop = watch.Loop(r, Seq([([10], None)] * 6), 1.0, say=said.append,
                          open_session=Sessions(lambda pids: answer(BUSY)))
        real = recorder.files.append

        def full(fd, data, sync=True):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(recorder.files, "append", full)
        for _ in range(3):
            loop.once()
        monkeypatch.setattr(recorder.files, "append", real)
        loop.once()
    full_lines = [s for s in said if "No space left" in s]
    assert len(full_lines) == 1 and "still watching" in full_lines[0]
    assert any("recording again (3 window(s) lost" in s for s in said)
    assert [x["seq"] for x in recorder.read(tmp_path / "ring").records] == [3]


def test_a_failing_doctor_is_a_recorded_window_not_the_end(tmp_path, monkeypatch):
    from proxytune.core.errors import ProxytuneError

    def fails(pids, window_s, **kw):
        raise ProxytuneError("bpftrace is not installed")
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    said = []
    with recorder.Recorder(tmp_path / "ring", 1 << 20) as r:
        rec = watch.Loop(r, Seq([([10], None)]), 1.0, say=said.append, open_session=fails).once()
    assert rec["status"] == windows.FAILED and rec["reason"] == "bpftrace is not installed"
    assert len(slept) == 1 and 0.9 < slept[0] <= 1.0          # the rest of the window: no busy loop
    assert any("the doctor failed: bpftrace is not installed" in s for s in said)


def test_a_failure_that_repeats_is_said_once_and_a_defect_of_ours_is_a_failed_window(tmp_path, monkeypatch):
    """A doctor failing every window said one line per window (the journal fills over a night); a bug
    of ours (an exception that is no OSError) ended the flight recorder."""
    from proxytune.core.errors import ProxytuneError
    errors = iter([ProxytuneError("bpftrace is not installed")] * 3 + [KeyError("t0")] * 2)

    def fails(pids, window_s, **kw):
        raise next(errors)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    said = []
    with recorder.Recorder(tmp_path / "ring", 1 << 20) as r:
        loop = watch.Loop(r, Seq([([10], None)] * 5), 1.0, say=said.append, open_session=fails)
        recs = [loop.once() for _ in range(5)]
    assert [x["status"] for x in recs] == [windows.FAILED] * 5
    assert recs[4]["reason"] == "internal error: KeyError: 't0'"
    assert said == ["window 0: the doctor failed: bpftrace is not installed",
                    "window 3: the doctor failed: internal error: KeyError: 't0'"]


def test_a_proc_that_cannot_be_read_is_a_failed_window_not_the_end(tmp_path, monkeypatch):
    """Out of fds (a flood of metrics clients, say), looking for the proxy raised EMFILE out of the loop."""
    class NoFds:
        what, kind = "proxy", None

        def find(self):
            raise OSError(24, "Too many open files", "/proc")
    monkeypatch.setattr(time, "sleep", lambda s: None)
    said = []
    with recorder.Recorder(tmp_path / "ring", 1 << 20) as r:
        loop = watch.Loop(r, NoFds(), 1.0, say=said.append, open_session=None)
        recs = [loop.once(), loop.once()]
    assert [x["status"] for x in recs] == [windows.FAILED] * 2
    assert recs[0]["reason"] == "cannot look for the proxy: Too many open files: /proc"
    assert said == ["window 0: cannot look for the proxy: Too many open files: /proc"]


def test_stopping_ends_the_open_episodes_in_the_journal(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    j, said = journal_socket(tmp_path, monkeypatch), []
    sessions = Sessions(lambda pids: answer(BUSY))
    with recorder.Recorder(tmp_path / "ring", 1 << 20) as r:
        loop = watch.Loop(r, Seq([([10], None)] * 2), 1.0, say=said.append, open_session=sessions)
        loop.forever(windows_max=2)
        loop.stopped()
    assert sessions.opened == [[10]] and sessions.closed == 1 and loop.session is None
    lines = drain(j)
    assert len(lines) == 2 and "PROXYTUNE_ACTION=watch-episode-end" in lines[1]
    assert "PROXYTUNE_WHY=the watch stopped" in lines[1] and loop.active == {}



def test_a_session_that_fails_mid_watch_is_detached_and_the_next_window_attaches_anew(tmp_path, monkeypatch):
    """bpftrace exiting (or missing its window) loses that window, recorded as failed; the next window
    starts a new session rather than reading a dead one."""
    from proxytune.core.errors import ProxytuneError
    monkeypatch.setattr(time, "sleep", lambda s: None)
    looks = [answer(HEALTHY), ProxytuneError("bpftrace exited with -9 (no message)"), answer(HEALTHY)]

    def look(pids):
        x = looks.pop(0)
        if isinstance(x, Exception):
            raise x
        return x
    sessions, said = Sessions(look), []
    with recorder.Recorder(tmp_path / "ring", 1 << 20) as r:
        watch.Loop(r, Seq([([10], None)] * 3), 1.0, say=said.append, open_session=sessions).forever(windows_max=3)
    recs = recorder.read(tmp_path / "ring").records
    assert [x["status"] for x in recs] == ["watched", "failed", "watched"]       # not 'absent': the proxy ran
    assert sessions.opened == [[10], [10]] and sessions.closed == 1


def test_a_reload_s_new_workers_get_a_new_session(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    sessions = Sessions(lambda pids: answer(HEALTHY))
    plan = [([10, 12], None), ([10, 12], None), ([10, 13], "haproxy reloaded: new workers 13")]
    with recorder.Recorder(tmp_path / "ring", 1 << 20) as r:
        watch.Loop(r, Seq(plan), 1.0, say=lambda l: None, open_session=sessions).forever(windows_max=3)
    assert sessions.opened == [[10, 12], [10, 13]] and sessions.closed == 1


@pytest.mark.parametrize("same_program", [True, False])
def test_a_stale_session_is_settled_again_in_place_or_replaced_when_its_program_changed(
        tmp_path, monkeypatch, same_program):
    """standing.REFRESH_S: a session older than that settles its triage and audit again; it stays attached
    when they compose the same program, else it is closed and a new one attached for the same pids."""
    monkeypatch.setattr(time, "sleep", lambda s: None)
    sessions = Sessions(lambda pids: answer(HEALTHY), same_program)
    with recorder.Recorder(tmp_path / "ring", 1 << 20) as r:
        loop = watch.Loop(r, Seq([([10], None)] * 3), 1.0, say=lambda l: None, open_session=sessions)
        loop.once()
        loop.session.stale = True
        loop.once()
        loop.once()
    assert sessions.refreshed == 1
    if same_program:
        assert sessions.opened == [[10]] and sessions.closed == 0
    else:
        assert sessions.opened == [[10], [10]] and sessions.closed == 1


@pytest.mark.parametrize("same", [True, False])
def test_refresh_keeps_the_attached_program_only_when_the_new_triage_composes_the_same(monkeypatch, same):
    """A kept program keeps the last window's closing reads (windows stay back to back), the proxy's object
    they were read through (its log cursors: nginx's error-log count), and ages anew."""
    from proxytune.probes import standing

    class Probes:
        def __init__(self, pids, use_perf=True, **kw):
            self.pids, self.carry, self.watched, self.kw = pids, None, object(), (use_perf, kw)
            self.sampling = kw.get("sampling") or types.SimpleNamespace(ok=True)   # finding it runs perf: once

        def program(self, dump_every_ms=None):
            return f"program {dump_every_ms}" if same else "another program"
    monkeypatch.setattr(standing.doctor, "Probes", Probes)
    monkeypatch.setattr(standing.shutil, "which", lambda name: f"/usr/bin/{name}")
    s = standing.Session.__new__(standing.Session)
    s.pids, s.window_s, s.use_perf, s.probes_kw, s.text = [10], 10.0, False, {"deep": True}, "program 10000"
    s.probes, s.started = Probes([10]), time.monotonic() - standing.REFRESH_S - 1
    s.probes.carry = {"at": 1.0}
    old = s.probes
    assert s.refresh() is same
    if same:
        assert s.probes is not old and s.probes.carry == {"at": 1.0} and s.probes.watched is old.watched
        assert s.probes.kw == (False, {"deep": True, "sampling": old.sampling, "standing": True}) and not s.stale
    else:
        assert s.probes is old and s.stale


def test_standing_sessions_age_by_refresh_s(monkeypatch):
    from proxytune.probes import standing
    s = standing.Session.__new__(standing.Session)
    s.started = time.monotonic() - standing.REFRESH_S - 1
    assert s.stale
    s.started = time.monotonic()
    assert not s.stale


def test_a_proxy_that_exits_in_its_window_is_absent_and_a_dead_tracer_is_a_failure(tmp_path, monkeypatch):
    """By the error's type (target.TargetGone), not its words: 'bpftrace exited' also says 'exited'."""
    from proxytune.core.errors import ProxytuneError
    from proxytune.probes import target
    monkeypatch.setattr(time, "sleep", lambda s: None)
    looks = [target.gone_error([10], {10: 0.4}, 1.0), ProxytuneError("bpftrace exited with -9 (no message)")]

    def look(pids):
        raise looks.pop(0)
    with recorder.Recorder(tmp_path / "ring", 1 << 20) as r:
        watch.Loop(r, Seq([([10], None)] * 2), 1.0, say=lambda l: None, open_session=Sessions(look)).forever(2)
    assert [x["status"] for x in recorder.read(tmp_path / "ring").records] == ["absent", "failed"]


def test_a_master_that_goes_or_is_replaced_while_it_is_judged_is_absent_not_the_end(monkeypatch):
    """masters() judged a process; it exited, and its pid was reused, before find() took it: the new
    process was followed for good. Or it exited while its workers were read: ProxytuneError ended
    the watch. Both are an absent window now; the next window looks again."""
    import os
    from proxytune.core import procfs
    from proxytune.core.errors import ProxytuneError
    from proxytune.probes import locate
    me = procfs.read_stat(os.getpid())
    monkeypatch.setattr(locate, "masters", lambda kind=None: ([(os.getpid(), me.start - 1)], ""))
    loc = locate.Locator()
    loc.kind = "haproxy"
    assert loc.find() == ([], "no haproxy is running; waiting for one")     # another process holds the pid now

    def gone(master, running=None):
        raise ProxytuneError(f"no process with pid {master}")
    monkeypatch.setattr(locate, "masters", lambda kind=None: ([(os.getpid(), me.start)], ""))
    monkeypatch.setattr(locate, "pids_of", gone)
    loc = locate.Locator()
    loc.kind = "haproxy"
    assert loc.find() == ([], "no haproxy is running; waiting for one") and loc.current is None

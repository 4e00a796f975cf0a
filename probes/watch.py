"""`watch`: the doctor in a loop, each window recorded, each episode's start and end logged.

Every window is the doctor's look (its reads, rules and answer) with its
default probes (no syscall tracepoint is attached unless its triage asks),
on the target the Locator finds this window; the probes stay attached from
window to window (standing.Session) until the target's processes change. One record per window goes to
the recorder, whatever happened: watched, the proxy absent, or the doctor
failing (and why). A window the recorder could not store (full disk) is
counted and said once, and the watch goes on. When a finding appears or
goes away, one line goes to the system journal (tune.eventlog), as an
operator's `journalctl -t proxytune` shows apply and rollback.
"""

import os
import time
from dataclasses import dataclass, field

from proxytune.core.errors import ProxytuneError
from proxytune.tune import eventlog

from . import episodes, standing, target, watchmetrics, windows
from .locate import Locator
from .recorder import Recorder

DEFAULT_WINDOW_S = 10.0


@dataclass
class Loop:
    """One watcher run: its recorder, its target, what it says (`say(line)`) and the episodes it has open."""
    recorder: Recorder
    locator: Locator
    window_s: float = DEFAULT_WINDOW_S
    say: callable = print
    diagnose_kw: dict = field(default_factory=dict)
    run: str = field(default_factory=lambda: f"{os.getpid()}-{int(time.time())}")
    seq: int = 0
    active: dict = field(default_factory=dict)        # finding id -> (episode id, finding) open now
    disk_said: bool = False
    session: object = None                            # the attached probes (standing.Session), while pids hold
    open_session: callable = standing.Session         # (pids, window_s, **diagnose_kw) -> a session
    publish: list = field(default_factory=list)       # each takes the metrics text after every window
    counts: dict = field(default_factory=dict)        # windows by status
    episodes_started: int = 0
    publish_said: set = field(default_factory=set)
    failure_said: str | None = None                   # the last failure said (each new one is said)

    def forever(self, windows_max: int | None = None) -> None:
        while windows_max is None or self.seq < windows_max:
            self.once()

    def once(self) -> dict:
        """Watch one window, record it, log episode edges; returns the record."""
        t0 = time.time()
        try:
            pids, line = self.locator.find()
        except (OSError, ProxytuneError) as e:          # /proc unreadable now (out of fds, say): the next window looks again
            pids, line = None, None
            why = "cannot look for the proxy: " + (e.message if isinstance(e, ProxytuneError)
                                                   else f"{e.strerror or e}: {e.filename or ''}")
        if line:
            self.say(line)
        if pids is None:
            self._say_failure(why)
            time.sleep(self.window_s)
            rec = windows.unwatched(self.run, self.seq, t0, time.time(), windows.FAILED, why, self.locator.kind)
        elif not pids:
            self._detach()
            time.sleep(self.window_s)
            rec = windows.unwatched(self.run, self.seq, t0, time.time(), windows.ABSENT,
                                    f"no {self.locator.what} running", self.locator.kind)
        else:
            rec = self._diagnose(pids, t0)
            if rec["status"] != windows.WATCHED:          # a doctor that failed at once must not spin; a watched
                time.sleep(max(0.0, t0 + self.window_s - time.time()))   # window ends on bpftrace's clock
        self._store(rec)
        self._edges(rec)
        self.counts[rec["status"]] = self.counts.get(rec["status"], 0) + 1
        self._publish(rec)
        self.seq += 1
        return rec

    def _publish(self, rec: dict) -> None:
        """The metrics to each consumer (textfile, endpoint); a consumer that fails is said once."""
        if not self.publish:
            return
        text = watchmetrics.text(rec, {"windows": self.counts, "episodes": self.episodes_started,
                                       "dropped": self.recorder.dropped, "cpu_s": watchmetrics.watcher_cpu_seconds()})
        for out in self.publish:
            try:
                out(text)
                self.publish_said.discard(out)
            except (ProxytuneError, OSError) as e:
                if out not in self.publish_said:
                    why = e.message if isinstance(e, ProxytuneError) else f"{e.strerror or e}: {e.filename or ''}"
                    self.say(f"metrics not written: {why}; still watching")
                    self.publish_said.add(out)

    def _diagnose(self, pids: list[int], t0: float) -> dict:
        try:
            result = self._session(pids).window()
        except Exception as e:                          # noqa: BLE001 (a flight recorder outlives one bad window)
            self._detach()                              # a new session settles everything again
            if isinstance(e, ProxytuneError):
                why = e.message
            elif isinstance(e, OSError):
                why = f"{e.strerror or e}: {e.filename or ''}"
            else:                                       # a defect of ours: recorded and said, not the end
                why = f"internal error: {type(e).__name__}: {e}"
            status = windows.ABSENT if isinstance(e, target.TargetGone) else windows.FAILED
            if status == windows.FAILED:
                self._say_failure(f"the doctor failed: {why}")
            return windows.unwatched(self.run, self.seq, t0, time.time(), status, why, self.locator.kind)
        self.failure_said = None
        return windows.watched(self.run, self.seq, t0, time.time(), result, self.locator.kind)

    def _say_failure(self, why: str) -> None:
        """A failure said once while it repeats (a doctor failing every window would fill the journal)."""
        if why != self.failure_said:
            self.say(f"window {self.seq}: {why}")
            self.failure_said = why

    def _session(self, pids: list[int]):
        """The attached probes for these pids: a new session when they changed, or when a stale one's
        settling again composes another program (else it is refreshed in place)."""
        if self.session is not None and self.session.pids != list(pids):
            self._detach()
        elif self.session is not None and self.session.stale and not self.session.refresh():
            self._detach()
        if self.session is None:
            self.session = self.open_session(list(pids), self.window_s, **self.diagnose_kw)
        return self.session

    def _detach(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            session.close()

    def _store(self, rec: dict) -> None:
        if self.recorder.append(rec):
            if self.disk_said:
                self.say(f"recording again ({self.recorder.dropped} window(s) lost while it failed)")
            self.disk_said = False
        elif not self.disk_said:
            self.say(f"{self.recorder.last_error}; still watching, windows are not kept until it has room")
            self.disk_said = True

    def _edges(self, rec: dict) -> None:
        """Journal one line per episode start and end (a window without the finding ends it)."""
        now = {f["id"]: f for f in rec["findings"] if isinstance(f, dict) and "id" in f}
        for fid in [k for k in self.active if k not in now]:
            ident, f = self.active.pop(fid)
            self._log("end", ident, f, rec)
        for fid, f in now.items():
            if fid not in self.active:
                self.episodes_started += 1
                self.active[fid] = (episodes.episode_id(rec["t0"], fid), f)
                self._log("start", self.active[fid][0], f, rec)

    def stopped(self) -> None:
        """The watch ends: so do its open episodes (a later run starts new ones), in the journal too."""
        self._detach()
        for ident, f in self.active.values():
            self._log("end", ident, f, {"proxy": self.locator.kind}, why="the watch stopped")
        self.active = {}

    def _log(self, edge: str, ident: str, f: dict, rec: dict, why: str | None = None) -> None:
        self.say(f"episode {edge}: {ident} ({f.get('severity')}) {f.get('title', '')}" + (f" ({why})" if why else ""))
        eventlog.record(f"watch-episode-{edge}", {"episode": ident, "proxy": rec.get("proxy") or "?",
                                                  "finding": f["id"], "severity": f.get("severity"),
                                                  "fix": f.get("fix", ""), **({"why": why} if why else {})},
                        eventlog.WARNING if f.get("severity") == "high" else eventlog.NOTICE)

"""The doctor's probes kept attached across the watcher's windows.

`doctor` compiles and attaches its bpftrace program for each look: seconds
of CPU, which a watcher looking every 10 s cannot pay (it made the watcher
cost ~19 % of a core). A Session attaches the program once, standing
(bpftrace.Standing: it dumps and clears its maps each window), and closes
each window with the same reads and rules as the doctor (doctor.Probes,
doctor.answer), so a watched window and a doctor run read alike.

What a session settles at its start (the triage's syscall scripts, the
proxy's processes, the host audit) is settled again every REFRESH_S, in
place while the program it composes is the same text (the attached one
stays: a new bpftrace costs ~3.3 s of CPU to compile and attach, which six
times an hour was 54 % of the watcher's cost over a busy hour), by a new
session when it is not, or when the proxy's processes change (a reload's
new workers, a restart). Once attached, bpftrace's compiler pages are given
back (core/pageout.py). perf samples a window only when the one before showed the
proxy at HOTSPOT_MIN_CPU or more: below it cpu-hotspot cannot fire
(findings.py), so a sample buys nothing the rules read.
"""

import shutil
import time

from proxytune.core import pageout, procgroup

from . import bpftrace, doctor, findings, target
# The watcher samples sockets TICKS_PER_WINDOW times a window (every 5 s of its default 10 s) and fd
# counts every FINE_S, where the doctor's one look does 4 and 100 times a second (connsample.py): each
# socket tick walks the kernel's whole established-socket hash (a sock_diag dump, core/tcpdiag.py: 5 to
# 7 ms of CPU here beside a busy proxy) and each fd read wakes a thread, which a look of
# seconds can pay and a watch of every hour cannot. Fewer ticks widen the stated uncertainty of the
# budget's sampled parts (a mean of 2 samples); a peak of sockets between two ticks is missed, one of fds
# between two reads too (the fd rules also read the kernel's EMFILE counts when near the limit).
# With 3 ticks a window the watcher cost 0.56 % of a core over a busy hour (docs/BENCHMARKS.md "The busy
# hour"), most of it in the ticks (~13 ms each, ~6 ms of it the kernel's): 2 cut that work by a third.
TICKS_PER_WINDOW = 2
FINE_S = 0.25
# A session's triage and audit are this old at most: then a new session settles them again.
REFRESH_S = 600.0
# A window that has not been dumped after this many window lengths is lost (a stuck or starved bpftrace).
LATE_WINDOWS = 3.0


def _page_out(proc) -> int | None:
    """Give a running tracer's compiler pages back; memory only: nothing here may stop a session."""
    if proc.poll() is not None:
        return None
    try:
        return pageout.page_out_files(proc.pid)
    except Exception:                 # noqa: BLE001 - a saving, never a reason to fail the watch
        return None


class Session:
    """One attached set of probes on `pids`; window() returns each window's doctor result."""

    def __init__(self, pids: list[int], window_s: float, use_perf: bool = True, **probes_kw):
        self.pids, self.window_s, self.use_perf, self.probes_kw = list(pids), window_s, use_perf, probes_kw
        self.started = time.monotonic()
        self.kids = procgroup.Children()
        self.kids.__enter__()
        self.standing = None
        try:
            self.probes = doctor.Probes(self.pids, use_perf=use_perf, standing=True, **probes_kw)
            self.text = self.probes.program(dump_every_ms=int(window_s * 1000))
            run = bpftrace.Run(self.kids, self.text)
            run.wait_attached()
            # attached, bpftrace never runs its compiler again: its LLVM and clang pages go back
            # (~70 MiB of its ~110 MiB RSS; core/pageout.py), None where the kernel does not allow it
            self.paged_out = _page_out(run.proc)
            self.standing = bpftrace.Standing(run, window_s)
            # the program's first interval began while it attached, before any window was open: its dump
            # is dropped, so each window's reads and its dump cover the same span (a first dump that came
            # within half an interval of the attach is held and dropped with the second: Standing)
            self.standing.next_window(LATE_WINDOWS * window_s)
        except BaseException:
            self.close()
            raise
        self.sample_next = use_perf

    @property
    def stale(self) -> bool:
        return time.monotonic() - self.started >= REFRESH_S

    def refresh(self) -> bool:
        """Settle the triage, the proxy's processes and the audit again. True when that composes the
        program already attached (kept, with the last window's closing reads for the next); False
        when the caller must start a new session for the new program. The kept program keeps the
        proxy's object too: the carried stats were read through it, and it holds their cursors (nginx
        counts its error log's lines from where that object first read it: a new one would start at
        0 and make the window's count negative)."""
        kept = self.probes.sampling if self.probes.sampling.ok and shutil.which("perf") else None    # else found anew
        probes = doctor.Probes(self.pids, use_perf=self.use_perf, sampling=kept, standing=True, **self.probes_kw)
        if probes.program(dump_every_ms=int(self.window_s * 1000)) != self.text:
            return False
        probes.carry, probes.watched = self.probes.carry, self.probes.watched
        self.probes, self.started = probes, time.monotonic()
        return True

    def window(self) -> dict:
        """Watch until bpftrace's next dump, ticking the socket sampler; the doctor's result for it.
        An error (ProxytuneError) when bpftrace exits or misses its window: the caller starts anew."""
        tick_s = self.window_s / TICKS_PER_WINDOW
        # standing: no walk of the hash at the window's end. The ephemeral ports' headroom counts the connected
        # ones only (no TIME-WAIT dump: running out is found by connect()'s EADDRNOTAVAIL, not by it), and the
        # established connections are the last tick's
        with self.probes.window(self.kids, use_perf=self.sample_next, tick_s=tick_s, fine_s=FINE_S,
                                standing=True) as w:
            t0 = w.opened                                   # the last window's close, when they run back to back
            while (maps := self.standing.poll(tick_s)) is None:
                elapsed = time.monotonic() - t0
                if elapsed > LATE_WINDOWS * self.window_s:
                    self.standing.next_window(0)            # raises: no window by the deadline
                w.sampler.sample()
                w.watch.poll(elapsed)
            w.watch.poll(time.monotonic() - t0)
            ev = self.probes.close(w, time.monotonic() - t0, lambda: maps)
        if ev["all_exited"]:
            raise target.gone_error(self.pids, ev["exited"], self.window_s)
        self.sample_next = self.use_perf and (ev.get("cpu_cores") or 0) >= findings.HOTSPOT_MIN_CPU
        return doctor.answer(ev, self.pids)

    def close(self) -> None:
        """Detach everything this session started (also after a failed start)."""
        if self.standing is not None:
            self.standing.stop()
            self.standing = None
        if self.kids is not None:
            self.kids.__exit__(None, None, None)
            self.kids = None

"""Which proxy the watcher watches this window, followed through reloads, restarts and absence.

A watcher outlives the processes it watches: nginx reloads (new workers, the
same master), a restart gives a new master pid, a stopped service leaves
nothing. So the target is re-found whenever the master watched is gone, by
the one rule of what is a proxy (core/proxytree.py): its unit's cgroup where
systemd runs it, else a tree under a root-started master running a root-owned
executable. A name proves nothing: a user's copy of sleep called squid is
never watched, nor preferred to the real proxy. A process is its pid plus its
start time, so a recycled pid is a new master.
"""

import os
import subprocess

from proxytune import proxies
from proxytune.core import procfs, proxytree
from proxytune.core.errors import ProxytuneError
from proxytune.core.numbers import uint

from . import proc, target


def masters(kind: str | None = None) -> tuple[list[tuple[int, int]], str]:
    """The running proxy's master of each kind (of `kind` only, when given) as (pid, start time), in
    the proxies' detection order, and a line naming the processes left out (a user's namesake, a
    second tree), or ""."""
    procs, units = proxytree.Processes(), proxytree.Units()
    out, notes = [], []
    for spec in proxies.KINDS:
        if kind is not None and spec.kind != kind:
            continue
        choice = proxytree.find(proxies.identity(spec), procs, units)
        if choice.tree and target.watchable([choice.tree.master]):
            out.append((choice.tree.master, choice.tree.start))
        if choice.note():
            notes.append(choice.note())
    return out, "; ".join(notes)


def unit_main_pid(unit: str) -> int | None:
    """The main pid systemd gives a proxy's unit, where systemd runs (not in a container or this VM)."""
    if not os.path.isdir("/run/systemd/system"):
        return None
    try:
        p = subprocess.run(["systemctl", "show", "--property=MainPID", "--value", "--", unit],
                           capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    pid = uint(p.stdout.strip())
    return pid if p.returncode == 0 and pid and target.watchable([pid]) else None


def pids_of(master: int, running=None) -> list[int]:
    """The master first, then the processes that hold the proxy's connections: its descendants with
    its executable (varnish's cache process is named otherwise), else children with its name.
    `running`: the master as proxies.identify() gave it (its config read), when the caller has it."""
    running = running or proxies.identify(master)
    if running is None:
        return proc.resolve(master, None)
    rest = sorted(set(target.watchable(running.processes())) - {master})
    return [master] + rest


class Locator:
    """`find()` each window: (pids to watch or [], a line to say when the target changed, or None)."""

    def __init__(self, pid: int | None = None, unit: str | None = None):
        self.kind: str | None = None
        self.current: tuple[int, int] | None = None      # (pid, start) of the master watched
        self.absent_said = False
        self.unit: str | None = None
        self.comm: str | None = None
        self._identified: tuple | None = None          # ((pid, start), proxies.identify(pid)) of the master
        self.note_said = ""                             # the last line said of processes left out
        if unit is not None:
            spec = proxies.for_service(unit)
            if spec is None:
                raise ProxytuneError(f"--unit {unit!r} is no proxy proxytune knows",
                                     "one of: " + ", ".join(s.unit for s in proxies.KINDS))
            self.kind, self.unit = spec.kind, spec.unit
        if pid is not None:
            st = target.check(pid)
            running = proxies.identify(pid)
            self.kind = running.kind if running else None
            self.current = (pid, st.start)
            self.comm = st.comm

    @property
    def what(self) -> str:
        return self.kind or (self.comm and f"process {self.comm}") or "proxy"

    def find(self) -> tuple[list[int], str | None]:
        if self.current and procfs.alive(*self.current):
            try:
                return pids_of(self.current[0], self._running()), None
            except ProxytuneError:              # it exited since: the next window follows what comes
                return [], None
        lost = self.current
        if lost and self.kind is None:          # a --pid that is no proxy: nothing to follow it by
            return self._absent(f"pid {lost[0]} exited; it is no proxy proxytune knows, so it cannot be followed")
        main = unit_main_pid(self.unit) if self.unit else None
        st = procfs.read_stat(main) if main else None
        found, note = ([(main, st.start)] if st else [], "") if main else masters(self.kind)
        if note and note != self.note_said:
            self.note_said = note
            say_note = proxytree.shown(note)
        else:
            say_note = None
        if not found:
            absent = self._absent(f"no {self.what} is running; waiting for one")
            return [], "; ".join(x for x in (absent[1], say_note) if x) or None
        pid, start = found[0]
        st = procfs.read_stat(pid)
        if st is None or st.gone or st.start != start:   # gone (or its pid reused) since it was judged
            return self._absent(f"no {self.what} is running; waiting for one")
        running = proxies.identify(pid)
        self.current, self.comm = (pid, start), st.comm
        self.kind = self.kind or (running.kind if running else None)
        self.absent_said = False
        say = (f"{self.kind} restarted: following its new master pid {pid} (was {lost[0]})" if lost else
               f"watching {self.what} master pid {pid}" + (f" (of {len(found)} proxies, the first)"
                                                          if len(found) > 1 else ""))
        try:
            pids = pids_of(pid, running)
        except ProxytuneError:                  # it exited while it was read: next window looks again
            self.current = lost
            return self._absent(f"no {self.what} is running; waiting for one")
        return pids, "; ".join(x for x in (say, say_note) if x)

    def _running(self):
        """The master watched, identified once while it lives (identify reads its config: the watcher
        asks every window, and a reload's new config is read by the new session's doctor)."""
        if self._identified is None or self._identified[0] != self.current:
            self._identified = (self.current, proxies.identify(self.current[0]))
        return self._identified[1]

    def _absent(self, line: str) -> tuple[list[int], str | None]:
        said, self.absent_said = self.absent_said, True
        return [], None if said else line

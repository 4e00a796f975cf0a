"""Resource limits of running processes (`rlimit:SERVICE:nofile`).

Reads (/proc/PID/limits, which any process may read) and sets (prlimit(2),
Python's resource.prlimit) limits of the processes named SERVICE (its comm)
that belong to a proxy's service: a running proxy gets its higher fd limit
now, without a restart. prlimit on another uid's process (nginx's workers)
needs CAP_SYS_RESOURCE, as raising a hard limit does; the plan says so. Which processes those
are is core.proxytree's one rule: a user's program called squid is left out
(and named), never read and never prlimit'ed. The value reported is the lowest
soft limit among them, since the soft limit is what accept() and open() run
into. Under --root nothing is read: the running processes are not that root's.

A process is its pid plus start time plus comm, never the pid alone: the
snapshot records all three, and undo skips (and reports) a pid that now
belongs to another process, so a recycled pid's limits are never touched.
"""

import os
import resource

from proxytune.core import proxytree
from proxytune.core.errors import BackendError, NotApplicable
from proxytune.core.procfs import (CAP_SYS_RESOURCE, RLIMITS, alive, has_capability, identity, limits_of,
                                   same_process, uids_of)
from proxytune.core.numbers import is_uint
from .base import Backend, split_pair

UNLIMITED = resource.RLIM_INFINITY


def split_key(key: str) -> tuple[str, str]:
    service, _, name = key.rpartition(":")
    return service, name


class RlimitBackend(Backend):
    kind = "rlimit"
    modes = ("at_least",)

    def validate(self, setting):
        super().validate(setting)
        split_pair(setting.key, "SERVICE:LIMIT, e.g. squid:nofile", RLIMITS)
        check_limit_value(setting.wanted)

    def _processes(self, comm: str) -> dict[int, int]:
        """pid -> start time of the processes named `comm` in a proxy's service; what was left out, in notes."""
        if not self.host.live:
            raise NotApplicable(f"not read under --root: the running processes are this host's, not {self.host.root}'s")
        from proxytune import proxies
        procs, units = proxytree.Processes(), proxytree.Units()
        pids, self.notes = {}, []
        for ident in proxies.identities_for(comm):
            choice = proxytree.find(ident, procs, units)
            mine = proxytree.named(choice, comm, procs)
            pids.update({p: procs.stat[p].start for p in mine})
            if choice.note() and (ident.name == comm or comm in ident.exe_names or mine):
                self.notes.append(choice.note())
        unread = [p for p, st in procs.stat.items() if st.comm == comm[:15] and isinstance(procs.exe(p), OSError)]
        if not pids and unread:
            raise BackendError(f"cannot tell whether pid {unread[0]} is a proxy's {comm}: permission denied "
                               "(another user's process: reading them needs root)", "run it as root")
        return pids

    def _limits(self, key):
        service, name = split_key(key)
        pids = self._processes(service)
        if not pids:
            raise NotApplicable(f"no running {service} process of a proxy's service")
        out = {pid: lim for pid in pids if (lim := limits_of(pid, name)) is not None}     # gone ones left out
        if not out:
            raise NotApplicable(f"no running {service} process of a proxy's service")
        self.starts = pids
        return out

    def read(self, key):
        return min(soft for soft, _ in self._limits(key).values())

    def snapshot(self, key):
        out = {}
        for pid, lim in self._limits(key).items():
            who = identity(pid)
            if who:
                out[str(pid)] = {"start": who["start"], "comm": who["comm"], "limits": list(lim)}
        return out

    def write(self, key, value):
        _, name = split_key(key)
        for pid, (soft, hard) in self._limits(key).items():
            if alive(pid, self.starts[pid]):        # still the process judged above, not a recycled pid
                self._set(pid, name, (max(soft, value), max(hard, value)))

    def restore(self, key, snap):
        self.undo(key, snap, None, force=True)

    def undo(self, key, old, wrote, force=False):
        """Per process: skip one that is gone or whose pid was recycled; keep a limit
        changed since the apply (unless force); else put the old limits back."""
        _, name = split_key(key)
        kept, notes = [], []
        for pid, rec in _records(old):
            if not same_process({"pid": pid, "start": rec["start"], "comm": rec["comm"]}):
                notes.append(f"skipped: pid {pid} ({rec['comm']}) is gone or is another process now; left alone")
                continue
            now = list(limits_of(pid, name) or [])
            if not now or now == rec["limits"]:           # gone meanwhile, or as it was
                continue
            after = dict(_records(wrote or {})).get(pid)
            if after is not None and now != after["limits"] and not force:
                kept.append(f"kept: {self.kind}:{key} of pid {pid} was changed since the apply "
                            f"(now {now[0]}:{now[1]})")
                continue
            self._set(pid, name, tuple(rec["limits"]))
        return kept, notes

    def _set(self, pid, name, limits):
        try:
            resource.prlimit(pid, RLIMITS[name], limits)
        except PermissionError:
            raise BackendError(f"prlimit pid {pid} {name}={limits[0]}:{limits[1]}: permission denied",
                               "raising a hard limit needs CAP_SYS_RESOURCE")
        except ValueError as e:
            raise BackendError(f"prlimit pid {pid} {name}={limits[0]}:{limits[1]}: {e}",
                               "the limit may exceed fs.nr_open")

    def obstacle(self, change):
        limits = self._limits(change.setting.key)
        if has_capability(CAP_SYS_RESOURCE):
            return None
        hard = min(h for _, h in limits.values())
        if change.target > hard and hard != UNLIMITED:
            return f"raising the hard limit above {hard} needs CAP_SYS_RESOURCE, which this process lacks"
        ours = (os.getuid(),) * 3, (os.getgid(),) * 3       # prlimit(2): real, effective and saved ids alike
        for pid in limits:
            ids = (uids_of(pid) or ())[:3], (uids_of(pid, "Gid") or ())[:3]
            if ids != ours:
                return (f"pid {pid} runs as uid {ids[0][0] if ids[0] else '?'}: prlimit on another user's process "
                        "needs CAP_SYS_RESOURCE, which this process lacks")
        return None


def check_limit_value(value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{value} is out of range (must be at least 1)")


def _records(snap) -> list[tuple[int, dict]]:
    """(pid, {start, comm, limits}) pairs of a snapshot, shape-checked (it comes from the journal)."""
    out = []
    for pid, rec in (snap.items() if isinstance(snap, dict) else ()):
        ok = (is_uint(str(pid)) and isinstance(rec, dict) and isinstance(rec.get("start"), int)
              and isinstance(rec.get("comm"), str) and isinstance(rec.get("limits"), list)
              and len(rec["limits"]) == 2 and all(isinstance(x, int) for x in rec["limits"]))
        if not ok:
            raise BackendError(f"journal snapshot of pid {str(pid)[:20]!r} has the wrong shape")
        out.append((int(pid), rec))
    return out

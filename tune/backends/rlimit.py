"""Resource limits of running processes (`rlimit:SERVICE:nofile`).

Reads and sets limits of every process named SERVICE with prlimit(2)
(Python's resource.prlimit): a running proxy gets its higher fd limit now,
without a restart. The value reported is the lowest soft limit among those
processes, since the soft limit is what accept() and open() run into.
Raising a hard limit needs CAP_SYS_RESOURCE; the plan says so up front.

A process is its pid plus start time plus comm, never the pid alone: the
snapshot records all three, and undo skips (and reports) a pid that now
belongs to another process, so a recycled pid's limits are never touched.
"""

import resource

from proxytune.core.errors import BackendError, NotApplicable
from proxytune.core.procfs import CAP_SYS_RESOURCE, RLIMITS, has_capability, identity, pids_of, same_process
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

    def _limits(self, key):
        service, name = split_key(key)
        pids = pids_of(service)
        if not pids:
            raise NotApplicable(f"no running {service} process")
        out = {}
        for pid in pids:
            try:
                out[pid] = resource.prlimit(pid, RLIMITS[name])
            except ProcessLookupError:
                continue
            except PermissionError:
                raise BackendError(f"cannot read limits of pid {pid}: permission denied (another user's process: "
                                   "reading them needs root)", "run it as root")
        if not out:
            raise NotApplicable(f"no running {service} process")
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
            try:
                now = list(resource.prlimit(pid, RLIMITS[name]))
            except ProcessLookupError:
                continue
            if now == rec["limits"]:
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
        hard = min(h for _, h in self._limits(change.setting.key).values())
        if change.target > hard and hard != UNLIMITED and not has_capability(CAP_SYS_RESOURCE):
            return f"raising the hard limit above {hard} needs CAP_SYS_RESOURCE, which this process lacks"
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

"""Which processes are the proxy: one rule for tune's detection, `rlimit:*`, the
exports, `doctor --comm` and monitoring.

A name proves nothing: any local user can `cp /bin/sleep ~/squid` and run it,
or rename a process with prctl. So a process counts only when it belongs to the
proxy's service:

- systemd runs as PID 1 and the proxy's unit is active: the processes in the
  unit's cgroup (/proc/PID/cgroup at or below the unit's ControlGroup; only root
  and systemd can move a process there), with the unit's MainPID as master;
- otherwise: a tree under a master that runs as root (real, effective, saved and
  fs uid 0: no user can start one; a setuid program keeps its real uid) from an
  executable named as the proxy's, that is a root-owned file not writable by
  others, in directories (every component, as the process sees them) owned by
  root and not writable by others (a sticky one like /tmp aside). The tree is
  the master and everything below it; a process is its pid plus start time.

Several such trees (two instances started by hand) are not merged: the oldest
is chosen, since a later one cannot displace the service that was there first,
and the others are named with why. A process a user started is named too,
with why it does not count.

System users (the only accounts adopted as a profile's {user}): uid 1 to
SYS_UID_MAX of /etc/login.defs (unset there: UID_MIN - 1, Debian's 999; Debian
policy 9.2.2 gives 0-99 to static and 100-999 to dynamic system accounts).
nobody (65534) is none: unrelated daemons and users share it.
"""

import os
import re
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import procfs
from .numbers import uint

SYSTEMD_RUNNING = Path("/run/systemd/system")      # sd_booted(3): systemd is the init system
LOGIN_DEFS = Path("/etc/login.defs")
DEBIAN_SYS_UID_MAX = 999
SHOWN = 5                                          # trees and refused processes named in a note


@dataclass(frozen=True)
class Identity:
    """What the proxy registry says about one proxy: its executables and its systemd unit."""
    name: str                               # for messages: squid
    exe_names: tuple[str, ...]              # basenames of the executables its processes run
    unit: str = ""                          # its unit without .service ("" : none known)
    managers: tuple[str, ...] = ()          # executables that start it (traffic_manager)


@dataclass(frozen=True)
class Tree:
    master: int
    start: int                              # the master's start time (clock ticks after boot)
    exe: str
    how: str                                # why it counts: the unit's cgroup, or the root-started master
    pids: tuple[int, ...]                   # the master first, then every process below it

    def shown(self) -> str:
        return f"pid {self.master} ({self.how})"


@dataclass
class Choice:
    """The tree that is the proxy, if any; the other valid trees; the processes that do not count."""
    identity: Identity
    tree: Tree | None = None
    others: list[Tree] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)      # "pid N (...): why it does not count"

    @property
    def pids(self) -> list[int]:
        return list(self.tree.pids) if self.tree else []

    def note(self) -> str:
        """One line: which tree this is and why, the others and the refused ones named; "" when plain."""
        parts = []
        if self.tree and self.others:
            rest = ", ".join(t.shown() for t in self.others[:SHOWN])
            parts.append(f"{self.identity.name}: {len(self.others) + 1} root-started trees run; using the oldest, "
                         f"{self.tree.shown()}, not {rest}")
        if self.refused:
            more = f" (+{len(self.refused) - SHOWN} more)" if len(self.refused) > SHOWN else ""
            parts.append(f"not {self.identity.name}'s service, ignored: " + "; ".join(self.refused[:SHOWN]) + more)
        return "; ".join(parts)


@dataclass(frozen=True)
class Unit:
    control_group: str
    main_pid: int


class Units:
    """The system manager's units, asked once each (`systemctl show`); none when systemd is not PID 1."""

    def __init__(self):
        self.cache: dict[str, Unit | None] = {}

    def get(self, name: str) -> Unit | None:
        if not name or not SYSTEMD_RUNNING.is_dir():
            return None
        if name not in self.cache:
            self.cache[name] = _show_unit(name)
        return self.cache[name]


def _show_unit(name: str) -> Unit | None:
    try:
        r = subprocess.run(["systemctl", "show", "--property=ControlGroup,MainPID", "--", f"{name}.service"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    props = dict(line.partition("=")[::2] for line in r.stdout.splitlines())
    group = props.get("ControlGroup", "")
    if r.returncode or not group.startswith("/") or group == "/":
        return None                                 # not loaded, or not running: no cgroup of its own
    return Unit(group, uint(props.get("MainPID", "0")) or 0)


class Processes:
    """One look at /proc, read as needed and kept: parents, start times, names, uids, executables."""

    def __init__(self):
        self.stat = {st.pid: st for st in map(procfs.read_stat, procfs.all_pids()) if st is not None and not st.gone}
        self.children: dict[int, list[int]] = {}
        for st in self.stat.values():
            self.children.setdefault(st.ppid, []).append(st.pid)
        self._exe: dict[int, str | None | OSError] = {}
        self._uids: dict[int, tuple | None] = {}

    def exe(self, pid: int) -> str | None | OSError:
        """The executable's path; None for a kernel thread or a gone process; the OSError when not ours to read."""
        if pid not in self._exe:
            try:
                self._exe[pid] = os.readlink(f"/proc/{pid}/exe")
            except FileNotFoundError:
                self._exe[pid] = None
            except OSError as e:
                self._exe[pid] = e
        return self._exe[pid]

    def uids(self, pid: int) -> tuple | None:
        if pid not in self._uids:
            self._uids[pid] = procfs.uids_of(pid)
        return self._uids[pid]

    def below(self, pid: int) -> list[int]:
        out, todo = [], [pid]
        while todo:
            p = todo.pop()
            out.append(p)
            todo += self.children.get(p, [])
        return [out[0]] + sorted(out[1:])

    def describe(self, pid: int) -> str:
        exe = self.exe(pid)
        uids = self.uids(pid)
        who = f"uid {uids[0]}" if uids else "uid ?"
        return f"pid {pid} {shown(exe if isinstance(exe, str) else self.stat[pid].comm)} ({who})"


def shown(text: str) -> str:
    """A path or name from /proc as one printable line (a user chooses both)."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def exe_name(exe: str) -> str:
    return os.path.basename(exe.removesuffix(" (deleted)"))


def find(identity: Identity, procs: Processes | None = None, units: Units | None = None) -> Choice:
    """The process tree that is this proxy's service now (see the module's docstring)."""
    procs = procs or Processes()
    units = units or Units()
    unit = units.get(identity.unit)
    names = set(identity.exe_names) | set(identity.managers)
    candidates, choice = [], Choice(identity)
    for pid in sorted(procs.stat):
        exe = procs.exe(pid)            # another user's is not ours to read (OSError): not judged, not counted
        if isinstance(exe, str) and exe_name(exe) in names:
            candidates.append(pid)
    if unit is not None:
        return _in_unit(choice, procs, unit, candidates)
    masters = [p for p in candidates if procs.stat[p].ppid not in candidates]
    trees = []
    for m in masters:
        why = not_root_started(m, procs)
        if why:
            choice.refused.append(f"{procs.describe(m)}: {why}")
        else:
            trees.append(Tree(m, procs.stat[m].start, procs.exe(m), f"root-started master {shown(procs.exe(m))}",
                              tuple(procs.below(m))))
    trees.sort(key=lambda t: (t.start, t.master))
    if trees:
        choice.tree, choice.others = trees[0], trees[1:]
    return choice


def _in_unit(choice: Choice, procs: Processes, unit: Unit, candidates: list[int]) -> Choice:
    """Under systemd: the unit's cgroup is the service; a candidate outside it is named and left out."""
    members = [p for p in sorted(procs.stat) if in_cgroup(p, unit.control_group)]
    for p in candidates:
        if p not in members:
            choice.refused.append(f"{procs.describe(p)}: outside {choice.identity.unit}.service's cgroup")
    if not members:
        return choice
    master = unit.main_pid if unit.main_pid in members else next((p for p in members if p in candidates), members[0])
    rest = tuple(p for p in members if p != master)
    exe = procs.exe(master)
    choice.tree = Tree(master, procs.stat[master].start, exe if isinstance(exe, str) else "?",
                       f"{choice.identity.unit}.service, its cgroup {shown(unit.control_group)}", (master, *rest))
    return choice


def in_cgroup(pid: int, group: str) -> bool:
    """Whether the process is in `group` or below, in the unified hierarchy or systemd's legacy one."""
    return any(path == group or path.startswith(group + "/")
               for controllers, path in procfs.cgroups_of(pid) if controllers in ("", "name=systemd"))


def not_root_started(pid: int, procs: Processes) -> str:
    """Why this master does not count ("" when it does): it must run as root from a trusted executable."""
    uids = procs.uids(pid)
    if uids is None:
        return "it exited"
    if any(uids):
        return "its master does not run as root (a user started it)"
    if why := untrusted_exe(pid, procs.exe(pid)):
        return why
    # the reads above were by pid, after the snapshot: a user's process that exited while they ran
    # could have left its pid to a root process, whose uids and executable then passed for it
    return "" if _unchanged(pid, procs) else "it changed while it was checked (exited, its pid reused, or exec'd)"


def _unchanged(pid: int, procs: Processes) -> bool:
    """pid is still the process of the snapshot: its start time (a reused pid has a later one) and its
    executable (an exec keeps both pid and start time) as they were."""
    st = procfs.read_stat(pid)
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return st is not None and not st.gone and st.start == procs.stat[pid].start and exe == procs.exe(pid)


def untrusted_exe(pid: int, exe: str) -> str:
    """Why the executable is not root's own ("" when it is): the file the process runs (its inode,
    through /proc/PID/exe) and every directory above its path, as the process sees them."""
    try:
        st = os.stat(f"/proc/{pid}/exe")
    except OSError as e:
        return f"its executable cannot be checked: {e.strerror}"
    if why := _foreign(st, shown(exe)):
        return why
    path = Path(exe.removesuffix(" (deleted)"))
    for d in reversed(path.parents):
        try:
            st = os.lstat(f"/proc/{pid}/root{d}")
        except OSError as e:
            return f"{shown(str(d))} cannot be checked: {e.strerror}"
        if not stat.S_ISDIR(st.st_mode):
            return f"{shown(str(d))} is not a directory now"
        if why := _foreign(st, shown(str(d)), sticky_ok=True):
            return why
    return ""


def _foreign(st: os.stat_result, what: str, sticky_ok: bool = False) -> str:
    if st.st_uid != 0:
        return f"{what} belongs to uid {st.st_uid}, not root"
    open_to_others = st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != 0)
    if open_to_others and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        return f"{what} is writable by others"
    return ""


def named(choice: Choice, comm: str, procs: Processes) -> list[int]:
    """The chosen tree's processes whose name (/proc/PID/comm, 15 characters) is `comm`."""
    want = comm[:15]
    return [p for p in choice.pids if p in procs.stat and procfs.comm_of(p) == want]


def sys_uid_max(login_defs: Path = LOGIN_DEFS) -> int:
    """The highest system uid: SYS_UID_MAX, else UID_MIN - 1, of login.defs; else Debian's 999."""
    try:
        text = login_defs.read_text(errors="replace")
    except OSError:
        return DEBIAN_SYS_UID_MAX
    found = dict(re.findall(r"^\s*(SYS_UID_MAX|UID_MIN)\s+(\d+)\s*$", text, re.M))
    if "SYS_UID_MAX" in found:
        return int(found["SYS_UID_MAX"])
    return int(found["UID_MIN"]) - 1 if "UID_MIN" in found else DEBIAN_SYS_UID_MAX


def is_system_uid(uid: int, top: int | None = None) -> bool:
    return 1 <= uid <= (sys_uid_max() if top is None else top)


def own(choice: Choice, procs: Processes) -> list[int]:
    """The chosen tree's processes that run the proxy's own executables (not its helpers or manager)."""
    return [p for p in choice.pids
            if isinstance(exe := procs.exe(p), str) and exe_name(exe) in choice.identity.exe_names]

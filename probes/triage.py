"""Which syscall tracepoints a doctor window needs, decided before any is attached.

Attaching any `syscalls:*` tracepoint puts every task's syscalls on the
kernel's slow path (kernel/tracepoint.c `syscall_regfunc` sets
SYSCALL_WORK_SYSCALL_TRACEPOINT on all of them): +58-65 ns per syscall on
this kernel, ~2 % of an nginx request, whatever the program does. So the
doctor attaches a syscall script only where what it measures is happening:

- `pollscan` when a thread of the target waits in poll/ppoll/select/pselect6,
  or when a process of it that holds sockets but no epoll instance (an
  `anon_inode:[eventpoll]` fd) is seen on CPU: a loop never seen waiting
  because its descriptors are always ready is still a poll/select loop
  (nginx's master holds sockets without epoll too, but sleeps in sigsuspend);
- `sync_calls` when its loop thread is inside fsync/fdatasync;
- `fd_errors` when a process holds half its fd limit or more (EMFILE can
  only come from a process near RLIMIT_NOFILE: fs/file.c `alloc_fd`);
- `origin_wait` (per packet, not per syscall, but as costly) when an
  upstream socket of the target's is one TCP_INFO cannot place: kept alive,
  its request sent, its last answer received and acknowledged in one jiffy
  (inflight.ambiguous). Sampled, its time budget's origin wait is then only
  bounded; traced, it is exact. A healthy proxy that pools connections to a
  fast origin has such sockets too (idle since an answer that came within
  the jiffy of its request): a one-shot doctor run pays the per-packet cost
  for an exact answer there as well; a watcher's standing session never
  attaches it (doctor.Probes).

What a thread waits in is read from /proc/PID/task/TID/syscall (the syscall
number and its arguments while the task sleeps in it; "running" while on
CPU): sampled a few times a second, nothing attached, nothing slowed.
"""

import os
import platform
import time

from proxytune.core.numbers import uint

from proxytune.core import procfs

from . import connsample, inflight

# Each process's loop thread (tid == pid) is read SAMPLES times over SPAN_S, every thread every SWEEP-th
# time. A loop inside fsync a share s of the time is missed by all of them with (1 - s)^SAMPLES: at the
# 5 % where blocking-disk-io starts, 0.6 %; at 12 % (a log synced per request here), 2e-6. With 12
# samples the fsync test missed 1 run in 5. Reading .../syscall of a task costs microseconds.
SAMPLES = 100
SPAN_S = 0.5
SWEEP = 10
LOOKS = 3               # sock_diag looks at the upstream sockets over the span (origin_wait's trigger)
FD_SHARE = 0.5          # fds held / soft limit from which EMFILE is worth counting at the syscalls

# syscall numbers by machine (arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h);
# for each: the argument that holds the descriptor count (poll: nfds, select: n)
CALLS = {
    "x86_64": {7: ("poll", 1), 271: ("ppoll", 1), 23: ("select", 0), 270: ("pselect6", 0),
               74: ("fsync", None), 75: ("fdatasync", None),
               232: ("epoll_wait", None), 281: ("epoll_pwait", None), 441: ("epoll_pwait2", None)},
    "aarch64": {73: ("ppoll", 1), 72: ("pselect6", 0), 82: ("fsync", None), 83: ("fdatasync", None),
                22: ("epoll_pwait", None), 441: ("epoll_pwait2", None)},
}
POLLS = {"poll", "ppoll", "select", "pselect6"}
SYNCS = {"fsync", "fdatasync"}


def waiting_in(pid: int, tid: int, table: dict) -> tuple[str, int | None] | None:
    """(syscall name, descriptor count or None) the thread sleeps in; ("running", None) on CPU;
    None when gone or in another call."""
    try:
        with open(f"/proc/{int(pid)}/task/{int(tid)}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return None
    if fields[:1] == ["running"]:
        return "running", None
    nr = uint(fields[0]) if fields else None
    if nr not in table:
        return None
    name, arg = table[nr]
    n = None
    if arg is not None and len(fields) > 1 + arg:
        try:
            n = int(fields[1 + arg], 16)
        except ValueError:
            n = None
    return name, n


def without_epoll(pids: list[int]) -> list[int]:
    """The pids that hold sockets but no epoll instance: their loop can only be poll/select (or threads)."""
    out = []
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{int(pid)}/fd/{fd}") for fd in os.listdir(f"/proc/{int(pid)}/fd")]
        except OSError:
            continue
        if "anon_inode:[eventpoll]" not in links and any(l.startswith("socket:") for l in links):
            out.append(pid)
    return out


def sample(pids: list[int], upstream_looks: bool = True) -> dict:
    """Where the target's threads wait over SPAN_S (loop threads SAMPLES times, all threads every SWEEP-th):
    counts per syscall, descriptors per poll."""
    table = CALLS.get(platform.machine())
    if table is None:
        return {"available": False, "reason": f"no syscall table for {platform.machine()}"}
    seen: dict[str, int] = {}
    nfds: list[int] = []
    loop_syncs = 0
    running: dict[int, int] = {}
    fds: dict[int, int] = {}            # the most fds each held: a proxy at its limit dips between accepts
    tids = {pid: procfs.thread_ids(pid) for pid in pids}
    ns = connsample.namespace_of(pids[0]) if pids and upstream_looks else None
    ties = 0 if ns is not None else None
    looks = {round(k * (SAMPLES - 1) / (LOOKS - 1)) for k in range(LOOKS)}      # the first, the last, between
    for i in range(SAMPLES):
        if ns is not None and i in looks:
            ties = max(ties, ambiguous_upstreams(ns, pids))
        for pid in tids:
            if i % SWEEP == 0:
                fds[pid] = max(fds.get(pid, 0), procfs.fd_count(pid) or 0)
        for pid, ts in tids.items():
            for tid in (ts if i % SWEEP == 0 else [pid]):
                got = waiting_in(pid, tid, table)
                if got is None:
                    continue
                if got[0] == "running":
                    running[pid] = running.get(pid, 0) + 1
                    continue
                seen[got[0]] = seen.get(got[0], 0) + 1
                if got[0] in POLLS and got[1] is not None:
                    nfds.append(got[1])
                loop_syncs += got[0] in SYNCS and tid == pid
        time.sleep(SPAN_S / SAMPLES)
    if ns is not None:
        ns.close()
    return {"available": True, "samples": SAMPLES, "threads": sum(map(len, tids.values())), "waits": seen,
            "running": {str(p): n for p, n in running.items()}, "poll_nfds_max": max(nfds, default=0), "loop_in_sync": loop_syncs,
            "ambiguous_upstreams": ties, "fds_max": {str(p): n for p, n in fds.items()}}


def ambiguous_upstreams(ns, pids: list[int]) -> int:
    """How many upstream sockets of the target's one sock_diag look finds ambiguous (sent, received and
    acknowledged in one jiffy: awaiting or idle)."""
    owned = {ino for pid in pids if (got := connsample.fd_inventory(pid)) for ino in got[1]}
    info: dict[int, dict] = {}
    rows = connsample.tcp_rows(ns, info=info)
    listening = {port for state, _, _, port, ino, _ in rows if state == "LISTEN" and ino in owned}
    return sum(1 for state, _, _, port, ino, _ in rows if state == "ESTAB" and ino in owned
               and port not in listening and inflight.ambiguous(info.get(ino) or {}))


def decide(pids: list[int], upstream_looks: bool = True) -> dict:
    """The triage: what was seen, and for each conditional script whether it is needed and why
    (upstream_looks=False: origin_wait may not attach anyway, so its sock_diag looks are not made)."""
    seen = sample(pids, upstream_looks)
    fd_share = 0.0
    for pid in pids:
        lim, held = procfs.nofile_limits(pid), (seen.get("fds_max") or {}).get(str(pid)) or procfs.fd_count(pid)
        if lim and lim[0] and held:
            fd_share = max(fd_share, held / lim[0])
    waits = seen.get("waits", {})
    polls = sum(waits.get(n, 0) for n in POLLS)
    no_epoll = [p for p in without_epoll(pids) if (seen.get("running") or {}).get(str(p))]
    ties = seen.get("ambiguous_upstreams")
    need = {
        "pollscan": (polls > 0 or bool(no_epoll) or not seen["available"],
                     f"a thread waits in poll/select ({polls} of the samples)" if polls else
                     f"pids {no_epoll} run with sockets but no epoll instance" if no_epoll else
                     "no thread waits in poll/select, and each process holds an epoll instance"),
        "sync_calls": (seen.get("loop_in_sync", 0) > 0 or not seen["available"],
                       "the loop thread is inside fsync/fdatasync" if seen.get("loop_in_sync") else
                       "the loop thread was not seen in fsync/fdatasync"),
        "fd_errors": (fd_share >= FD_SHARE, f"fds at {fd_share:.0%} of the soft limit"
                      + (" (EMFILE is possible)" if fd_share >= FD_SHARE else f", below {FD_SHARE:.0%}")),
        "origin_wait": (bool(ties), f"{ties} kept-alive upstream socket(s) sent, received and were acknowledged "
                                    "in one jiffy: awaiting their origin or idle, which sampling cannot tell" if ties
                        else "every upstream socket sampled was placed (awaiting, idle or reading)" if ties == 0
                        else "the target's sockets could not be read (its network namespace)" if upstream_looks
                        else "not looked at: origin_wait may not attach to this target"),
    }
    return {**seen, "fd_share": round(fd_share, 3), "without_epoll": no_epoll,
            "need": {k: {"attach": bool(a), "why": why} for k, (a, why) in need.items()}}

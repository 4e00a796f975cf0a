"""Rules: evidence in, findings out. Each finding has a stable id, a
severity, the numbers behind it and the fix. Thresholds sit next to the
rule that uses them; every rule reads only the evidence dict that
doctor.gather() builds, so rules are testable on recorded evidence.

Severity: high = clients are failing or waiting now; medium = capacity or
CPU lost; low = worth fixing before the next peak.
"""

from dataclasses import asdict, dataclass, field

SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2}

# fd-exhaustion: any EMFILE/ENFILE in the window, or this share of the soft limit open.
FD_USE_MAX = 0.90
# low-nofile-limit: a busy proxy needs more than Debian's soft default of 1024.
LOW_NOFILE = 4096
# poll-scan: select/poll passing at least this many descriptors per call on average ...
POLL_SCAN_MIN_NFDS = 500
# ... of which at most this share is ready (the rest is scanned for nothing) ...
POLL_SCAN_MAX_READY_SHARE = 0.05
# ... at least this often (an idle loop scanning once a second costs nothing).
POLL_SCAN_MIN_CALLS_PER_S = 20
# blocking-disk-io: the event-loop thread asleep on the disk (D state) or in fsync for this share of the window.
BLOCKING_MIN_SHARE = 0.05
# file-per-object-churn: files created or unlinked per second by the proxy.
CHURN_MIN_PER_S = 20
# cpu-hotspot: the target uses at least this much of one CPU ...
HOTSPOT_MIN_CPU = 0.20
# ... and one function holds at least this share of its samples ...
HOTSPOT_MIN_SHARE = 0.10
# ... and its CPU is what its requests wait on: a thread that serves them is busy at least this share of the
# window. An event loop (an nginx worker, a haproxy thread, a squid kid, an ATS ET_NET thread) runs its ready
# events one after the other, so at utilisation u an event that becomes ready waits on average u / (1 - u)
# event times before the loop reaches it (M/M/1 queue): 4 at 0.8, 9 at 0.9, under half an event's own time
# at 0.3. Below this the loop is idle most of the window and any busy proxy has some function at 10 %.
HOTSPOT_LOOP_BUSY = 0.8
# cpu-hotspot needs this many samples of the target to say anything.
HOTSPOT_MIN_SAMPLES = 50
# time-wait-overflow: a TIME_WAIT bucket lives TCP_TIMEWAIT_LEN (60 s, include/net/tcp.h), so the buckets a
# close rate needs are rate * 60; the suggested cap is twice that.
TIME_WAIT_S = 60
# conntrack-full: __nf_conntrack_alloc() (net/netfilter/nf_conntrack_core.c) early-drops, then drops the
# packet ("table full, dropping packet") once the namespace's count passes nf_conntrack_max; this share of
# the cap leaves one burst of headroom.
CONNTRACK_USE_MAX = 0.90
# orphan-sockets: tcp_out_of_resources() (net/ipv4/tcp_timer.c) calls tcp_check_oom() with a shift of up to
# 2 for an orphan that is silent or got ICMP errors, and tcp_too_many_orphans() resets it once
# orphans << shift > tcp_max_orphans: resets start at a quarter of the limit.
ORPHAN_SHARE = 0.25


@dataclass
class Finding:
    id: str
    severity: str
    title: str
    evidence: dict
    fix: str
    impact: float = 0.0          # for ranking within a severity: share of time or rate of failures
    references: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def _per_s(n: float, ev: dict) -> float:
    """A bpftrace counter per second of the time bpftrace was attached."""
    w = ev.get("bpf_window_s") or ev["window_s"]
    return n / w if w > 0 else 0.0


def _share(ns: float, ev: dict, threads: int = 1) -> float:
    """Nanoseconds summed by bpftrace as a share of its window (per thread)."""
    w = ev.get("bpf_window_s") or ev["window_s"]
    return min(1.0, ns / 1e9 / w / max(threads, 1)) if w > 0 else 0.0


def peak_fds(ev: dict, pid: str) -> int | None:
    """The most fds the sampler saw pid hold in the window (connsample, every 0.25 s)."""
    return (((ev.get("conns") or {}).get("pids") or {}).get(pid) or {}).get("fds_peak")


def fd_peak_use(ev: dict) -> tuple[str | None, float]:
    """(pid, sampled peak fds / soft limit) of the process nearest its limit."""
    best: tuple[str | None, float] = (None, 0.0)
    for pid, p in ev["procs"].items():
        soft, peak = p.get("nofile_soft"), peak_fds(ev, pid)
        if isinstance(soft, int) and soft and peak and peak / soft > best[1]:
            best = (pid, peak / soft)
    return best


def fd_exhaustion(ev: dict) -> Finding | None:
    errs = {}
    for key, n in (ev["bpf"].get("@fderr") or {}).items():
        probe, errno = key.rsplit(",", 1)
        name = probe.rsplit("sys_exit_", 1)[-1]
        errs[f"{name} {'EMFILE' if errno.strip() == '24' else 'ENFILE'}"] = n
    worst = max(ev["procs"].values(), key=lambda p: p.get("fd_use", 0), default={})
    use = worst.get("fd_use", 0)
    peak_pid, peak = fd_peak_use(ev)
    if peak > use:                   # the sampled peak: a proxy at its limit drops below it between samples
        worst, use = ev["procs"].get(peak_pid, worst), peak
    if not errs and use < FD_USE_MAX:
        return None
    enfile = any(k.endswith("ENFILE") for k in errs)
    fix = ("raise the system-wide limit: sysctl fs.file-max (profile linux/proxy: sysctl:fs.file-max)" if enfile else
           "raise the proxy's fd limit: nginx `worker_rlimit_nofile 65536;` (and worker_connections below it), "
           "squid `max_filedescriptors 65536`, systemd `LimitNOFILE=65536` (profile linux/proxy: "
           "service:UNIT:LimitNOFILE, limits:USER:nofile, rlimit:SERVICE:nofile; `proxytune tune apply`)")
    return Finding("fd-exhaustion", "high", "the proxy runs out of file descriptors",
                   {"errors": errs, "errors_per_s": round(_per_s(sum(errs.values()), ev), 1),
                    "fds_open": worst.get("fds_open"), "fds_peak": peak_fds(ev, str(worst.get("pid"))),
                    "nofile_soft": worst.get("nofile_soft"),
                    "fd_use": round(use, 3), "pid": worst.get("pid")},
                   fix, impact=_per_s(sum(errs.values()), ev) + use)


def low_nofile_limit(ev: dict) -> Finding | None:
    low = [p for p in ev["procs"].values() if isinstance(p.get("nofile_soft"), int) and p["nofile_soft"] < LOW_NOFILE]
    if not low:
        return None
    pressed = any(p.get("fd_use", 0) > 0.5 for p in low) or bool(ev["bpf"].get("@fderr"))
    return Finding("low-nofile-limit", "medium" if pressed else "low",
                   f"soft fd limit below {LOW_NOFILE}",
                   {"processes": [{"pid": p["pid"], "comm": p["comm"], "nofile_soft": p["nofile_soft"],
                                   "nofile_hard": p["nofile_hard"], "fds_open": p["fds_open"]} for p in low]},
                   "raise nofile to 65536 for the proxy's service (profile linux/proxy: service:UNIT:LimitNOFILE, "
                   "limits:USER:nofile; nginx worker_rlimit_nofile, squid max_filedescriptors), then restart it",
                   impact=1 - min(p["nofile_soft"] for p in low) / LOW_NOFILE)


def own_listen_drops(ev: dict) -> int | None:
    """Drops the kernel counted on the proxy's own listeners in the window (each listener's sk_drops, which
    tcp_listendrop() raises for every SYN or handshake ACK it drops: connsample), or None when not read."""
    conns = ev.get("conns") or {}
    if not (conns.get("listen_drops") or {}).get("available"):
        return None
    return sum(r.get("drops", 0) for r in (conns.get("ports") or {}).values())


def _other_listeners(ev: dict) -> list[dict]:
    """The namespace's other listeners that dropped (by their own count) or that a tick saw full (connsample)."""
    return ((ev.get("conns") or {}).get("listen_drops") or {}).get("others") or []


def overflowed_here(ev: dict) -> tuple[bool | None, str]:
    """Whether the namespace's listen overflows are this proxy's: (True/False, why), or (None, why) when the
    evidence cannot tell. TcpExt counts every listener of the network namespace (another process's, the
    proxy's own origin's); the proxy's listeners show an overflow of theirs as their own drops, or, where
    those were not read, as a queue the sampler saw."""
    drops = own_listen_drops(ev)
    if drops is not None:
        return (drops > 0, f"its own listeners counted {drops} drops (sk_drops) in the window")
    ports = (ev.get("conns") or {}).get("ports") or {}
    if any(r.get("queued_peak", 0) > 0 for r in ports.values()):
        return True, "its own accept queue was seen non-empty (per-listener drops not read)"
    if _other_listeners(ev) and ports:
        return False, "its own accept queue was never seen non-empty while another listener's was seen full"
    return None, "not attributed: per-listener drops were not read and no queue was seen"


def _full_now(ev: dict) -> list[dict]:
    return [l for l in ev["listeners"] if l["queued"] >= l["backlog"] > 0]


def elsewhere(ev: dict) -> dict[str, int]:
    """The namespace-wide listen counters of the window that are not this proxy's: ListenOverflows when its
    own listeners show no overflow (overflowed_here is False) and no full queue now; the SYN-queue ones as
    well when they are drops (counted per listener too: tcp_listendrop), or, for cookies (which drop
    nothing), when another listener is seen overflowing."""
    d = ev["netstat"]
    if overflowed_here(ev)[0] is not False or _full_now(ev):
        return {}
    out = {k: d[k] for k in ("ListenOverflows", "ListenDrops", "TCPReqQFullDrop") if d.get(k, 0) > 0}
    if d.get("TCPReqQFullDoCookies", 0) > 0 and _other_listeners(ev):
        out["TCPReqQFullDoCookies"] = d["TCPReqQFullDoCookies"]
    return out


def accept_queue_overflow(ev: dict) -> Finding | None:
    d = ev["netstat"]
    full = _full_now(ev)
    if d.get("ListenOverflows", 0) <= 0 and not full or "ListenOverflows" in elsewhere(ev):
        return None
    return Finding("accept-queue-overflow", "high", "connections dropped: the accept queue overflowed",
                   {"ListenOverflows": d.get("ListenOverflows", 0), "ListenDrops": d.get("ListenDrops", 0),
                    "per_s": round(_per_s(d.get("ListenOverflows", 0), ev), 1),
                    "listeners": [{"local": l["local"], "queued": l["queued"], "backlog": l["backlog"]}
                                  for l in ev["listeners"]],
                    "own_listener_drops": own_listen_drops(ev), "attributed": overflowed_here(ev)[1],
                    "note": "TcpExt counters are for the whole network namespace, not only this process"},
                   "raise net.core.somaxconn (profile linux/proxy: sysctl:net.core.somaxconn >= 8192) and the "
                   "listen backlog (nginx `listen ... backlog=8192`); a loop that accepts too slowly needs more "
                   "workers or a cheaper loop (see the other findings)",
                   impact=_per_s(d.get("ListenOverflows", 0), ev))


def other_listener_overflow(ev: dict) -> Finding | None:
    """Listen overflows another listener of the namespace counted: a low note naming it, not this proxy's
    finding (its fix is not in this proxy's config)."""
    counted = elsewhere(ev)
    if not counted:
        return None
    others = _other_listeners(ev)
    named = [f"{o['local']} ({(o.get('process') or {}).get('comm', '?')} pid {(o.get('process') or {}).get('pid', '?')})"
             for o in others]
    where = ", ".join(named) if named else "a listener that no longer exists at the window's end"
    ports = (ev.get("conns") or {}).get("ports") or {}
    own = [{"local": l["local"], **{k: r.get(k) for k in ("queued_peak", "backlog", "drops")}}
           for l in ev["listeners"] for r in [ports.get(l["local"].rsplit(":", 1)[-1], {})]]
    n = max(counted.values())
    return Finding("other-listener-overflow", "low",
                   f"another listener in this network namespace overflowed, not this proxy's: {where}",
                   {**counted, "per_s": round(_per_s(n, ev), 1), "overflowed": others, "own_listeners": own,
                    "attributed": overflowed_here(ev)[1],
                    "note": "TcpExt ListenOverflows, ListenDrops and TCPReqQFull* count every listener of the "
                            "network namespace; each listener's own drops (sk_drops, `ss -tlm` skmem d) say "
                            "which one dropped"},
                   f"nothing to change in this proxy for it: the listener that overflowed is {where}; raise its "
                   "backlog or make it accept sooner if it matters (when it is this proxy's origin, the proxy's "
                   "connects to it wait for SYN retransmits)", impact=_per_s(n, ev) / 1e6)


def syn_backlog_overflow(ev: dict) -> Finding | None:
    d = ev["netstat"]
    drops, cookies = d.get("TCPReqQFullDrop", 0), d.get("TCPReqQFullDoCookies", 0)
    gone = elsewhere(ev)
    drops, cookies = (0 if "TCPReqQFullDrop" in gone else drops), (0 if "TCPReqQFullDoCookies" in gone else cookies)
    if drops + cookies <= 0:
        return None
    return Finding("syn-backlog-overflow", "high" if drops else "medium", "the SYN queue overflowed",
                   {"TCPReqQFullDrop": drops, "TCPReqQFullDoCookies": cookies,
                    "note": "TcpExt counters are for the whole network namespace"},
                   "raise the listen backlog and net.core.somaxconn (profile linux/proxy: >= 8192): the kernel "
                   "judges the SYN queue full against the listen backlog (inet_csk_reqsk_queue_is_full); keep "
                   "net.ipv4.tcp_syncookies = 1 (tcp_max_syn_backlog only drops early when syncookies are off)",
                   impact=_per_s(drops + cookies, ev))


def ephemeral_port_exhaustion(ev: dict) -> Finding | None:
    b = ev["bpf"]
    conn = {int(k): v for k, v in (b.get("@conn") or {}).items()}       # connect_errors.bt (--deep)
    fails, attempts = conn.get(99, 0), sum(conn.values())
    if "@conn" not in b:                                                # connect_fail.bt: no port, source 0
        fails, attempts = b.get("@conn_noport", 0) or 0, b.get("@conn_tries", 0) or 0
    if fails <= 0:
        return None
    return Finding("ephemeral-port-exhaustion", "high", "connect() fails: no local port left (EADDRNOTAVAIL)",
                   {"connect_calls": attempts, "eaddrnotavail": fails, "failed_share": round(fails / max(attempts, fails), 3),
                    "per_s": round(_per_s(fails, ev), 1), "port_range": ev.get("port_range")},
                   "widen net.ipv4.ip_local_port_range to 1024 65535 and set net.ipv4.tcp_tw_reuse = 1 (profile "
                   "linux/proxy); keep server connections open (squid server_persistent_connections on, nginx "
                   "upstream keepalive)", impact=_per_s(fails, ev))


def poll_scan(ev: dict) -> Finding | None:
    b = ev["bpf"]
    calls = b.get("@poll_calls", 0) or 0
    if calls <= 0:
        return None
    nfds, ready = b.get("@poll_nfds", 0) / calls, b.get("@poll_ready", 0) / calls
    rate = _per_s(calls, ev)
    if nfds < POLL_SCAN_MIN_NFDS or ready > POLL_SCAN_MAX_READY_SHARE * nfds or rate < POLL_SCAN_MIN_CALLS_PER_S:
        return None
    inside = _share(b.get("@poll_ns", 0), ev, len(ev["pids"]))
    return Finding("poll-scan", "high" if nfds / max(ready, 1) >= 100 else "medium",
                   "select/poll scans many idle descriptors per call",
                   {"calls_per_s": round(rate), "mean_nfds": round(nfds), "mean_ready": round(ready, 2),
                    "descriptors_scanned_per_ready": round(nfds / max(ready, 0.01)),
                    "share_of_window_in_poll": round(inside, 3)},
                   "switch the event loop to epoll (squid is built with it on Debian; nginx `use epoll;`): its cost "
                   "follows the ready descriptors, not the watched ones (`proxytune bench events` shows both)",
                   impact=inside, references=["Banga & Mogul 1998; Mogul, Speedier Squid"])


def blocking_disk_io(ev: dict) -> Finding | None:
    b = ev["bpf"]
    dstate = _share(b.get("@dstate_ns", 0), ev, len(ev["pids"]))
    sync = _share(b.get("@sync_ns", 0), ev, len(ev["pids"]))
    share = max(dstate, sync)
    if share < BLOCKING_MIN_SHARE:
        return None
    return Finding("blocking-disk-io", "high" if share >= 0.25 else "medium",
                   "the event-loop thread sleeps on the disk",
                   {"share_in_d_state": round(dstate, 3), "d_state_sleeps": b.get("@dstate_sleeps", 0),
                    **({"fsync_calls": b.get("@sync_calls", 0), "share_in_fsync": round(sync, 3)}
                       if "@sync_calls" in b or "sync_calls" in ev.get("scripts", []) else {"fsync": "not traced: the triage did not see the loop thread in fsync/fdatasync"})},
                   "take disk waits off the event loop: squid cache_dir aufs or rock (threads or disker "
                   "processes) instead of ufs; nginx `aio threads;`; no fsync/fdatasync in the loop (batch them "
                   "on a thread)", impact=share)


def _file_churn(b: dict) -> tuple[int, int]:
    """(creates, unlinks): at the syscalls when file_lifecycle.bt ran (--deep), else at ext4 (fs_churn.bt)."""
    if "@file_open" in b or "@file_create" in b:
        return b.get("@file_create", 0) or 0, b.get("@file_unlink", 0) or 0
    return b.get("@fs_create", 0) or 0, b.get("@fs_unlink", 0) or 0


def _dev(key) -> str:
    """The kernel's dev_t (major << 20 | minor) as MAJ:MIN, as /proc/self/mountinfo writes it."""
    n = int(key)
    return f"{n >> 20}:{n & 0xfffff}"


def file_per_object_churn(ev: dict) -> Finding | None:
    b = ev["bpf"]
    creates, unlinks = _file_churn(b)
    rate = _per_s(max(creates, unlinks), ev)
    if rate < CHURN_MIN_PER_S:
        return None
    seen = ({"opens_per_s": round(_per_s(b.get("@file_open", 0) or 0, ev), 1),
             "closes_per_s": round(_per_s(b.get("@file_close", 0) or 0, ev), 1),
             "top_path_prefixes": dict(sorted((b.get("@file_prefix") or {}).items(), key=lambda kv: -kv[1])[:5])}
            if "@file_open" in b else
            {"devices": {_dev(k): v for k, v in (b.get("@fs_dev") or {}).items()},
             "counted_at": "ext4 inode allocation and unlink (fs_churn.bt); opens and paths: --deep"})
    return Finding("file-per-object-churn", "medium", "one file per cached object: a create per miss, an unlink per eviction",
                   {"creates_per_s": round(_per_s(creates, ev), 1), "unlinks_per_s": round(_per_s(unlinks, ev), 1),
                    **seen},
                   "store objects in one large file: squid `cache_dir rock` (one database file, slots) instead "
                   "of ufs/aufs/diskd; mount the cache noatime (`proxytune bench storage` measures the gain on "
                   "this disk)", impact=rate / 1000, references=["the 2002 Squid paper: one large file + async I/O"])


def cache_dir_atime(ev: dict) -> Finding | None:
    bad = [d for d in ev.get("cache_dirs", []) if d.get("atime") and d["atime"] != "noatime"]
    if not bad:
        return None
    b = ev["bpf"]
    # each open of a cached file is a read of it; without file_lifecycle.bt (--deep) the creates and
    # unlinks are the lower bound of the files touched
    opens = _per_s(b["@file_open"] if "@file_open" in b else sum(_file_churn(b)), ev)
    return Finding("cache-dir-atime", "medium" if opens >= CHURN_MIN_PER_S else "low",
                   "cache directory mounted without noatime",
                   {"dirs": [{"path": d["path"], "mountpoint": d.get("mountpoint"), "atime": d["atime"]} for d in bad],
                    ("opens_per_s" if "@file_open" in b else "files_touched_per_s"): round(opens, 1)},
                   "mount the cache with noatime (profile linux/proxy: mount:DIR:noatime; `proxytune tune apply "
                   "--only 'mount:*'` remounts and updates fstab)",
                   impact=opens / 10000, references=["Squid: The Definitive Guide, Appendix D"])


def _rate(n: float, ev: dict) -> float:
    """A TcpExt delta per second of the doctor's window."""
    return n / ev["window_s"] if ev.get("window_s") else 0.0


def _kernel(ev: dict) -> tuple[dict, dict]:
    """The namespace's sysctls and TCP sockstat line (empty when they were not read)."""
    k = ev.get("kernel") or {}
    return k.get("sysctl") or {}, k.get("sockstat") or {}


def time_wait_overflow(ev: dict) -> Finding | None:
    # tcp_time_wait() (net/ipv4/tcp_minisocks.c): when inet_twsk_alloc() refuses a bucket because
    # tcp_max_tw_buckets are in use, the socket is closed at once and TCPTimeWaitOverflow counts it.
    n = ev["netstat"].get("TCPTimeWaitOverflow", 0)
    if n <= 0:
        return None
    sysctl, ss = _kernel(ev)
    cap, tw, rate = sysctl.get("net.ipv4.tcp_max_tw_buckets"), ss.get("tw"), _rate(n, ev)
    want = 2 * ((tw or 0) + int(rate * TIME_WAIT_S) + 1)
    return Finding("time-wait-overflow", "medium", "closed connections skip TIME_WAIT: tcp_max_tw_buckets is reached",
                   {"TCPTimeWaitOverflow": n, "per_s": round(rate, 1), "tcp_max_tw_buckets": cap,
                    "time_wait_now": tw,
                    "note": "without TIME_WAIT a late segment of the old connection can reach a new one on the "
                            "same ports; TcpExt and the cap are the target's network namespace's"},
                   f"raise net.ipv4.tcp_max_tw_buckets (now {cap}; at least {max(want, (cap or 0) * 2)}: each "
                   f"bucket lives {TIME_WAIT_S} s) and close fewer connections: keep-alive to the origins "
                   "(squid server_persistent_connections on, nginx upstream `keepalive`, HAProxy `http-reuse`) "
                   "and to the clients", impact=rate)


def conntrack_full(ev: dict) -> Finding | None:
    ct = (ev.get("kernel") or {}).get("conntrack") or {}
    if not ct.get("available"):
        return None
    st = ct.get("stats_delta") or {}
    lost = st.get("drop", 0) + st.get("insert_failed", 0)
    use = ct["count"] / ct["max"] if ct.get("max") else 0.0        # not the rounded share in the evidence
    if lost <= 0 and st.get("early_drop", 0) <= 0 and use < CONNTRACK_USE_MAX:
        return None
    return Finding("conntrack-full", "high" if lost > 0 else "medium", "the connection-tracking table is full",
                   {"nf_conntrack_count": ct["count"], "nf_conntrack_max": ct["max"], "use": round(use, 4),
                    "nf_conntrack_buckets": ct.get("buckets"), "stats_delta": st or None,
                    "drops_per_s": round(_rate(lost, ev), 1),
                    "note": "drop: new connections dropped (table full); insert_failed: entries lost on insert; "
                            "early_drop: old entries evicted to make room"},
                   f"raise net.netfilter.nf_conntrack_max (now {ct['max']}) and the hash table with it "
                   f"(net.netfilter.nf_conntrack_buckets, now {ct.get('buckets')}), or stop tracking the proxy's "
                   "own traffic: nft `... raw prerouting tcp dport PORT notrack` and `raw output tcp sport PORT "
                   "notrack` (iptables -t raw ... -j CT --notrack)", impact=_rate(lost, ev) + use)


def tcp_memory_pressure(ev: dict) -> Finding | None:
    # __sk_mem_raise_allocated() (net/core/sock.c): above tcp_mem[1] pages TCP enters memory pressure
    # (tcp_enter_memory_pressure counts TCPMemoryPressures) and shrinks buffers; above tcp_mem[2] it refuses
    # allocations: receive queues are pruned and packets dropped (RcvPruned, TCPRcvQDrop).
    d = ev["netstat"]
    sysctl, ss = _kernel(ev)
    limits, mem = sysctl.get("net.ipv4.tcp_mem"), ss.get("mem")
    limits = limits if isinstance(limits, list) and len(limits) == 3 else None
    entered = d.get("TCPMemoryPressures", 0)
    over = limits is not None and mem is not None and mem > limits[1]
    if entered <= 0 and not over:
        return None
    dropped = d.get("TCPRcvQDrop", 0) + d.get("RcvPruned", 0)
    hard = limits is not None and mem is not None and mem > limits[2]
    page = (ev.get("kernel") or {}).get("page_size") or 4096
    now = " ".join(map(str, limits)) if limits else "unknown"
    more = " ".join(str(v * 2) for v in limits) if limits else "twice each value"
    return Finding("tcp-memory-pressure", "high" if hard or dropped else "medium",
                   "TCP is short of memory: buffers are shrunk" + (", packets dropped" if hard or dropped else ""),
                   {"TCPMemoryPressures": entered, "TCPRcvQDrop": d.get("TCPRcvQDrop", 0),
                    "RcvPruned": d.get("RcvPruned", 0), "tcp_mem_pages_now": mem, "tcp_mem": limits,
                    "tcp_mem_MiB_now": round(mem * page / 2**20) if mem is not None else None,
                    "note": "tcp_mem and the pages in use are host-wide (all namespaces)"},
                   f"raise net.ipv4.tcp_mem (now {now} pages of {page} bytes; e.g. {more} if RAM allows) and find "
                   "the sockets that hold the memory: `ss -tmn` shows each socket's buffers; large Recv-Q/Send-Q "
                   "are slow readers (clients that do not read, or a proxy that reads origins faster than it "
                   "sends): cap them with smaller buffers or the proxy's read-ahead limits", impact=entered + dropped)


def orphan_sockets(ev: dict) -> Finding | None:
    # tcp_check_oom() (net/ipv4/tcp.c) resets an orphan (closed by the proxy, data or FIN still in flight)
    # with "too many orphaned sockets" or "out of memory -- consider tuning tcp_mem"; TCPAbortOnMemory counts it.
    aborts = ev["netstat"].get("TCPAbortOnMemory", 0)
    sysctl, ss = _kernel(ev)
    cap, orphans = sysctl.get("net.ipv4.tcp_max_orphans"), ss.get("orphan")
    share = orphans / cap if isinstance(cap, int) and cap > 0 and orphans is not None else 0.0
    if aborts <= 0 and share < ORPHAN_SHARE:
        return None
    fin = sysctl.get("net.ipv4.tcp_fin_timeout")
    return Finding("orphan-sockets", "high" if aborts else "medium",
                   "orphaned sockets are reset" if aborts else "orphaned sockets near tcp_max_orphans",
                   {"TCPAbortOnMemory": aborts, "per_s": round(_rate(aborts, ev), 1), "orphans_now": orphans,
                    "tcp_max_orphans": cap, "share": round(share, 3), "tcp_fin_timeout": fin,
                    "note": "orphans and tcp_max_orphans are host-wide; an orphan is reset from a quarter of "
                            "the limit when it is idle or got ICMP errors, and TCPAbortOnMemory also counts "
                            "resets for memory over tcp_mem[2] (see tcp-memory-pressure)"},
                   f"raise net.ipv4.tcp_max_orphans (now {cap}; each orphan can pin up to ~64 KB), shorten "
                   f"net.ipv4.tcp_fin_timeout (now {fin} s) so FIN_WAIT2 orphans go sooner, and find the cause: "
                   "`ss -tan state fin-wait-1 state fin-wait-2 state last-ack` shows the peers that stopped "
                   "reading or answering (a client gone, an origin that never closes)", impact=aborts + share)


def listen_drops(ev: dict) -> Finding | None:
    # tcp_listendrop() counts ListenDrops for every SYN or handshake ACK a listener drops; ListenOverflows is
    # the accept-queue-full subset and TCPReqQFullDrop the SYN-queue-full one (both named by their own
    # findings). The rest (net/ipv4/tcp_input.c tcp_conn_request, net/ipv4/tcp_ipv4.c): no route back to the
    # client (route_req fails), no memory for the request or the child socket (inet_reqsk_alloc,
    # tcp_v4_syn_recv_sock), SYNs to a broadcast/multicast address, an LSM refusing the request.
    d = ev["netstat"]
    drops, over, synq = d.get("ListenDrops", 0), d.get("ListenOverflows", 0), d.get("TCPReqQFullDrop", 0)
    other = drops - over - synq
    if other <= 0:
        return None
    return Finding("listen-drops", "high", "listeners drop connection requests that are not queue overflows",
                   {"ListenDrops": drops, "ListenOverflows": over, "TCPReqQFullDrop": synq, "other_drops": other,
                    "per_s": round(_rate(other, ev), 1), "OutNoRoutes": d.get("OutNoRoutes"),
                    "other_causes": "no route back to the client, no memory for the request or the new socket, "
                                    "SYNs to a broadcast/multicast address, a security module refusing it",
                    "note": "TcpExt counters are for the whole network namespace; Ip OutNoRoutes growing with "
                            "the drops points at the route back to the clients"},
                   "check the route back to the clients (`ip route get CLIENT`; rp_filter and policy routing), "
                   "then memory (see tcp-memory-pressure; dmesg for "
                   "allocation failures) and SELinux/AppArmor denials; `perf trace -e skb:kfree_skb` or "
                   "`dropwatch` names the dropping function", impact=_rate(other, ev))


IRQ_RESTORE = ("_raw_spin_unlock_irqrestore", "_raw_spin_unlock_irq", "pv_native_safe_halt")


def cpu_waited_on(ev: dict) -> tuple[bool, dict]:
    """Whether the proxy's own CPU is what its requests wait on, and the reading that says so: its busiest
    thread near a full core (an event loop serialises its events), or every CPU it may run on busy (a pool
    that gives each request a thread, as varnish does). Per-thread CPU comes from /proc/PID/task/TID/stat
    over the window (doctor.gather: ev["threads"]); without it nothing says the loop is busy."""
    t = ev.get("threads") or {}
    if not t.get("available") or not t.get("busiest"):
        return False, {"reason": t.get("reason") or "per-thread CPU was not recorded"}
    top = t["busiest"][0]
    cpus = t.get("cpus_allowed") or 1
    loop = top["cores"] >= HOTSPOT_LOOP_BUSY
    pool = (ev.get("cpu_cores") or 0) >= HOTSPOT_LOOP_BUSY * cpus
    # Hook for the time budget (ev["budget"], built by probes/budget.py): its proxy_self part (CPU and run
    # queue) dominating a request's time answers the same question directly; it joins here as a third reason
    # (`or budget proxy_self share dominates`), reported alongside these two.
    return loop or pool, {"busiest_thread": top, "cpus_allowed": cpus, "cpu_cores": round(ev.get("cpu_cores") or 0, 3),
                          "criterion": f"a thread at >= {HOTSPOT_LOOP_BUSY} of a core, or the process at >= "
                                       f"{HOTSPOT_LOOP_BUSY} of each of its {cpus} CPUs",
                          "met": "busiest thread" if loop else "all its CPUs" if pool else "no"}


def _hot(ev: dict) -> tuple[list, list] | None:
    """(hot leaf functions, hot functions of the proxy's own code) when perf saw the target busy enough."""
    p = ev.get("perf") or {}
    if not p.get("available") or p.get("samples", 0) < HOTSPOT_MIN_SAMPLES or ev.get("cpu_cores", 0) < HOTSPOT_MIN_CPU:
        return None
    hot = [t for t in p["top"] if t["share"] >= HOTSPOT_MIN_SHARE]
    hot_own = [t for t in p.get("own_top", []) if t["share"] >= HOTSPOT_MIN_SHARE]
    return (hot, hot_own) if hot or hot_own else None


def _rounded(t: dict) -> dict:
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in t.items()}


def cpu_hotspot(ev: dict) -> Finding | None:
    found = _hot(ev)
    waited, loop = cpu_waited_on(ev)
    if not found or not waited:
        return None                       # the top functions are information then: see cpu_headroom
    hot, hot_own = found
    p, cpu = ev["perf"], ev.get("cpu_cores", 0)
    # Name the proxy's own function when one is hot, counting the kernel and library work it calls
    # directly (from the call chains): it is the code the operator can change. Else the hottest leaf.
    own = hot_own
    named = own[0] if own else hot[0]
    evidence = {"cpu_cores": round(cpu, 2), "samples": p["samples"], "function": named["function"],
                "dso": named["dso"], "share": round(named["share"], 3),
                "attribution": "own code with its direct kernel/library calls" if own else "self time",
                "hot_self": [_rounded(t) for t in hot[:5]], "hot_own_code": [_rounded(t) for t in hot_own[:5]],
                "split": {k: round(v, 3) for k, v in p["split"].items()}, "cpu_waited_on": loop}
    if any(t["function"] in IRQ_RESTORE for t in hot):
        evidence["note"] = ("cpu-clock samples in a VM land where interrupts are re-enabled, so kernel time "
                            "piles up on *_irqrestore: read it as time inside the kernel's syscalls")
    return Finding("cpu-hotspot", "medium", f"{named['function']} takes {named['share']:.0%} of the proxy's CPU",
                   evidence,
                   f"start with {named['function']} ({named['dso']}): with the kernel and library work it calls it "
                   f"takes {named['share']:.0%} of the proxy's CPU. If it walks every descriptor or cache entry per "
                   "event, that is the classic O(N) case (see poll-scan); if its time is in syscalls, fewer and "
                   "larger calls help; `proxytune probe cachemiss -- CMD` tells whether it is memory-bound",
                   impact=named["share"] * cpu)


def cpu_headroom(ev: dict) -> dict | None:
    """The busiest thread's CPU against one core, with the top functions as information when they are no
    finding (no thread near a full core: the proxy's requests do not wait on its CPU)."""
    t = ev.get("threads") or {}
    if not t.get("available") or not t.get("busiest"):
        return None
    top = t["busiest"][0]
    row = {"what": f"CPU of its busiest thread ({top['comm']}, pid {top['pid']} tid {top['tid']}), in cores",
           "key": "CPU of its busiest thread, in cores", "used": top["cores"], "limit": 1,
           "where": f"/proc/{top['pid']}/task/{top['tid']}/stat; from {HOTSPOT_LOOP_BUSY} of a core its requests "
                    "wait on its CPU (cpu-hotspot)"}
    p = ev.get("perf") or {}
    if p.get("available") and p.get("top") and not cpu_waited_on(ev)[0]:
        row["top_functions"] = [_rounded(x) for x in p["top"][:3]]
        row["top_own_code"] = [_rounded(x) for x in (p.get("own_top") or [])[:2]]
        named = lambda rows: ", ".join(f"{x['function']} {x['share']:.0%}" for x in rows)
        row["where"] += f"; top functions (information, no finding): {named(p['top'][:3])}"
        if row["top_own_code"]:
            row["where"] += f"; of its own code, with the calls it makes: {named(row['top_own_code'])}"
    return row


RULES = [fd_exhaustion, low_nofile_limit, accept_queue_overflow, other_listener_overflow, syn_backlog_overflow,
         ephemeral_port_exhaustion,
         poll_scan, blocking_disk_io, file_per_object_churn, cache_dir_atime, cpu_hotspot,
         time_wait_overflow, conntrack_full, tcp_memory_pressure, orphan_sockets, listen_drops]


def evaluate(ev: dict) -> list[Finding]:
    """Every rule on the evidence; findings ranked by severity, then impact."""
    out = [f for f in (rule(ev) for rule in RULES) if f]
    return sorted(out, key=lambda f: (SEVERITY_RANK[f.severity], -f.impact))

"""`doctor`: attach to a running proxy for a bounded window and name what
limits it. One bpftrace program (the catalog's default scripts composed,
filtered by the target's pids, aggregating in the kernel) and one
system-wide `perf record -e cpu-clock` run side by side; /proc and TcpExt
counters are read before and after; the host audit (`tune check`) runs
first. Rules in findings.py turn the evidence into ranked findings.

Nothing here writes to the target: tracepoints and sampling only, no
uprobes on its hot paths; every tracer is reaped on exit and on Ctrl-C.
"""

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from proxytune.core.errors import ProxytuneError
from proxytune.core import procfs, procgroup, sockets
from proxytune.core.capability import no
from proxytune.tune import audit as audit_mod, observe

from . import budget, budget_findings, bpftrace, caps, connsample, findings, netstat, nsstate, owncap, perf, proc, \
    proxies, proxies_findings, sched, target, triage

# Always: no syscall tracepoint among them (see triage.py for why that matters). budget.bt also counts what
# connect_fail.bt does: one program at each TCP state change of the host instead of two.
DEFAULT_SCRIPTS = ["loop_blocking", "fs_churn", "budget"]
# Per-call or per-packet scripts, each attached when the triage sees what it measures (or with --deep).
TRIAGED_SCRIPTS = ["pollscan", "fd_errors", "sync_calls", "origin_wait"]
DEEP_SCRIPTS = ["connect_errors", "file_lifecycle", "epoll_events", "biolatency", "runqlat", "budget_reads"]


def proxy_cache_dirs(watched) -> list[str]:
    """The cache directories the config a running proxy was started with names (read as it read it)."""
    return watched.cache_dirs() if watched is not None else []


def audit(host, profile_ref: str, service: str, cache_dirs: list[str]) -> dict:
    """The host audit against the profile (what `tune check` shows), reduced to what drifts."""
    try:
        found = audit_mod.build(host, profile_ref, {"service": service, "cache_dirs": cache_dirs})
    except ProxytuneError as e:
        return no(e.message).to_result()
    return {"available": True, "profile": profile_ref, "summary": found.plan.to_json()["summary"],
            "drift": found.drift()}


def usable_scripts(deep: bool = False, need: dict | None = None) -> tuple[list, dict[str, str]]:
    """The scripts the doctor composes (default ones, the triaged ones it needs, and the deep ones when
    asked) whose tracepoints this kernel has, and why each other one is skipped. `need` is the triage's
    verdict per triaged script (triage.decide()["need"]); None attaches them all."""
    cat = bpftrace.catalog()
    scripts, skipped = [], {}
    wanted = [n for n in TRIAGED_SCRIPTS if deep or need is None or need.get(n, {}).get("attach", True)]
    for name in DEFAULT_SCRIPTS + wanted + (DEEP_SCRIPTS if deep else []):
        missing = bpftrace.missing_tracepoints(cat[name])
        if missing:
            skipped[name] = f"tracepoints missing: {', '.join(missing)}"
        else:
            scripts.append(cat[name])
    return scripts, skipped


def gather(pids: list[int], duration: float, host=None, profile_ref: str = "linux/proxy",
           cache_dirs: list[str] | None = None, deep: bool = False, use_perf: bool = True, tick=None,
           stacks: bool = True) -> dict:
    """Run the probes for `duration` seconds against `pids`; return the evidence dict the rules read.
    stacks=False: perf samples without call graphs (the CPU split needs the sampled frame only; a
    report's watch would spend ~10 s unwinding stacks no rule of it reads)."""
    duration = target.duration(duration)
    probes = Probes(pids, host, profile_ref, cache_dirs, deep, use_perf, stacks=stacks)
    with procgroup.Children() as kids:
        run = bpftrace.Run(kids, probes.program())
        run.wait_attached()
        with probes.window(kids) as w:
            seconds = w.watch.wait(duration, lambda t: (w.sampler.sample(), tick and tick(t)))
            return probes.close(w, seconds, run.stop)


class Probes:
    """The doctor's probes on one target: what is settled before its first window (the triage, the
    scripts it attaches, the proxy, the host audit) and the reads that open and close each window.
    gather() runs one window on a bpftrace it attaches for it; the watcher runs window after window
    on one standing bpftrace (bpftrace.Standing), each window closed by the program's dump."""

    def __init__(self, pids: list[int], host=None, profile_ref: str = "linux/proxy",
                 cache_dirs: list[str] | None = None, deep: bool = False, use_perf: bool = True,
                 sampling: caps.Capability | None = None, stacks: bool = True, standing: bool = False):
        """`sampling`: whether perf can sample, already found (a standing session settled again keeps
        its own: finding it runs `perf record -a`, 0.3 s of CPU each time); `stacks`: perf's call graphs;
        `standing`: for a watcher's standing session (nothing per packet)."""
        caps.require_tracefs()
        if not bpftrace.version():
            raise ProxytuneError("bpftrace is not installed", "Debian: apt-get install bpftrace")
        self.pids = pids
        self.watched = proxies.identify(pids[0])
        self.every = list(dict.fromkeys(pids + (self.watched.processes() if self.watched else [])))
        self.args = script_args(self.every)
        refused = self._per_packet_refused(standing)
        self.triaged = triage.decide(pids, upstream_looks=refused is None)     # no looks for a script refused
        self.scripts, self.skipped = usable_scripts(deep, self.triaged["need"])
        if refused and any(s.name == "origin_wait" for s in self.scripts):
            self.scripts = [s for s in self.scripts if s.name != "origin_wait"]
            self.skipped["origin_wait"] = refused
        self.comm = procfs.comm_of(pids[0])
        profile_ref, service = proxies.audit_as(self.watched, profile_ref, self.comm)
        self.dirs = list(cache_dirs or []) or proxy_cache_dirs(self.watched)
        self.port_range = nsstate.port_range(pids[0])
        self.audit = (audit(host, profile_ref, service, self.dirs) if host is not None
                      else {"available": False, "reason": "not asked"})
        self.sampling = sampling or (caps.perf_sampling() if use_perf else no("not asked (--no-perf)"))
        self.nspath = f"/proc/{pids[0]}/net/netstat"
        self.carry: dict | None = None      # a standing window's closing reads: the next one's opening reads
        self.stacks = stacks

    def program(self, dump_every_ms: int | None = None) -> str:
        """The composed bpftrace program; standing (dumped every window) with dump_every_ms."""
        return bpftrace.compose(self.scripts, self.pids, self.args, dump_every_ms)

    def _per_packet_refused(self, standing: bool) -> str | None:
        """Why origin_wait.bt may not attach, None when it may: the proxy's own clock times its requests (the
        budget places the origin's wait with it: budget.origin_first_byte), upstream sockets cannot be told
        from clients (no listening port found, or more than budget_args keeps), or a standing session (per
        packet, it is not for always-on)."""
        ports = self.args["origin_wait"]
        clock = self.watched.timing() if self.watched is not None else None
        return ("a standing session (watch) attaches nothing per packet" if standing else
                f"{self.watched.kind}'s own clock times its requests: the budget places the origin's wait with it"
                if clock is not None and not clock.data.get("unavailable") else
                "no listening port of the proxy found: its upstream sockets cannot be told from its clients"
                if not ports["ports"] else
                f"more than {MAX_PORTS} listening ports: a client socket could count as upstream"
                if ports["truncated"] else None)

    @contextlib.contextmanager
    def window(self, kids: procgroup.Children, use_perf: bool = True, tick_s: float = connsample.TICK_S,
               fine_s: float = connsample.FINE_S, standing: bool = False):
        """Open a window: perf (when sampling), the proxy's stats and own clocks, /proc, TcpExt,
        conntrack and scheduler snapshots, the first socket sample (the caller samples every tick_s).
        Its clocks stop on any exit."""
        carry, self.carry = (self.carry if standing else None), None
        w = Window(sampler=connsample.Sampler(self.every, self.port_range,
                                              self.watched.worker_thread if self.watched else None, tick_s, fine_s,
                                              standing))
        with own_clocks(self.watched) as w.clocks:
            w.rec = perf.Record(kids, callgraph=self.stacks) if self.sampling.ok and use_perf else None
            w.watch = target.Watch(self.pids)
            if carry:                                       # back to back: the last window's end is this one's start
                w.opened, w.stats0, w.before, w.ns0 = carry["at"], carry["stats"], carry["proc"], carry["netstat"]
                w.threads0, w.sched0, w.sampler.drops0 = carry["threads"], carry["sched"], carry["drops"]
            else:
                w.stats0 = self.watched.stats() if self.watched else None
                w.before, w.ns0 = proc.snapshot(self.pids, w.watch.ids), netstat.snapshot(self.nspath)
                w.threads0, w.sched0 = proc.thread_times(w.sampler.pids), sched.snapshot(self.every)
            w.ct0 = nsstate.conntrack_stats(self.pids[0])
            w.clocks.start()
            w.sampler.sample()
            yield w

    def close(self, w: "Window", seconds: float, maps_of) -> dict:
        """Close window w after `seconds`: the reads again, then `maps_of()` (stopping a one-window
        bpftrace, or the standing one's dump), perf's profile; returns the evidence dict."""
        closed_at = time.monotonic()
        sched1 = sched.snapshot(self.every)
        w.clocks.stop()
        pids, nspath = self.pids, self.nspath
        after, ns1 = proc.snapshot(pids, w.watch.ids), (netstat.snapshot(nspath) if Path(nspath).exists() else w.ns0)
        w.sampler.window_end()                            # each listener's drops, against the same TcpExt window
        threads1 = proc.thread_times(w.sampler.pids)
        ev: dict = {"pids": pids, "comm": self.comm, "skipped_scripts": self.skipped, "triage": self.triaged,
                    "scripts": [s.name for s in self.scripts], "port_range": self.port_range, "audit": self.audit,
                    "kernel": nsstate.read(pids[0], w.ct0)}   # sysctls, sockstat, conntrack of its namespace
        stats1 = self.watched.stats() if self.watched else None
        ev["proxy"] = ({**self.watched.describe(), "stats_before": w.stats0, "stats_after": stats1,
                        "timing": w.clocks.result()} if self.watched else None)
        if w.sampler.standing:
            self.carry = {"at": closed_at, "stats": stats1, "proc": after, "netstat": ns1,
                          "threads": threads1, "sched": sched1, "drops": w.sampler.drops1}
        maps = maps_of()
        if w.rec:
            prof = w.rec.stop(pids)
        else:
            prof = self.sampling.to_result() if not self.sampling.ok else no("not sampled in this window").to_result()
        return self._evidence(ev, w, seconds, maps, prof, (after, ns1, threads1, sched1))

    def _evidence(self, ev: dict, w: "Window", seconds: float, maps: dict, prof: dict, ends: tuple) -> dict:
        after, ns1, threads1, sched1 = ends
        ev["window_s"] = seconds
        ev["sched"] = sched.delta(w.sched0, sched1, seconds)
        ev["bpf"] = {k: v for k, v in maps.items() if not k.startswith("_")}
        ev["bpftrace_stderr"] = maps.get("_stderr", "")
        ev["bpf_window_s"] = maps.get("_window_s") or seconds
        ev["netstat"] = netstat.delta(w.ns0, ns1)
        ev["exited"] = {str(p): s for p, s in w.watch.exited.items()}
        ev["all_exited"] = w.watch.all_gone
        ev["procs"], ev["cpu_cores"] = proc_figures(self.pids, w.before, after, seconds)
        ev["threads"] = proc.busiest_threads(w.threads0, threads1, self.pids[0])
        ev["listeners"] = sockets.listeners(self.pids, w.sampler.ns)      # the window's own sock_diag socket
        # a standing window takes them from its last tick, not from another walk of the hash
        ev["connections"] = (w.sampler.established if w.sampler.standing and w.sampler.established is not None
                             else sockets.connections({l["local"].rsplit(":", 1)[-1] for l in ev["listeners"]},
                                                      self.pids, w.sampler.ns))
        ev["conns"] = w.sampler.summary()
        ev["cache_dirs"] = observe.observe("", self.dirs, None)["cache_dirs"] if self.dirs else []
        ev["perf"] = prof
        ev["loop"] = loop_summary(ev)
        return ev


@dataclass
class Window:
    """One window's opening reads (Probes.window) and what closes them."""
    sampler: connsample.Sampler
    opened: float = field(default_factory=time.monotonic)    # when its opening reads were taken
    clocks: object = None
    rec: object = None
    watch: object = None
    stats0: object = None
    before: dict = field(default_factory=dict)
    ns0: dict = field(default_factory=dict)
    threads0: dict = field(default_factory=dict)
    ct0: object = None
    sched0: object = None


def proc_figures(pids: list[int], before: dict, after: dict, window: float) -> tuple[dict, float]:
    """Per pid its fds against its limit at the end, and the CPUs the pids used over the window."""
    procs, cpu = {}, 0.0
    for pid in (p for p in pids if p in before):
        a, b = before[pid], after.get(pid, before[pid])
        soft = b["nofile_soft"]
        fds = b["fds_open"] if b["fds_open"] is not None else a["fds_open"]
        procs[str(pid)] = {"pid": pid, "comm": a["comm"], "fds_open": fds, "nofile_soft": soft,
                           "nofile_hard": b["nofile_hard"],
                           "fd_use": fds / soft if isinstance(soft, int) and soft and fds is not None else 0.0}
        if a["cpu_s"] is not None and b["cpu_s"] is not None:
            cpu += b["cpu_s"] - a["cpu_s"]
    return procs, (cpu / window if window > 0 else 0.0)


MAX_PORTS = 64          # listening ports a program tests against (one comparison each, per event)
# the scripts that take the proxy's processes, listening ports and network namespace (budget_args)
PORT_SCRIPTS = ("budget", "budget_reads", "origin_wait")


def script_args(every: list[int]) -> dict[str, dict]:
    """compose()'s per-script values for the proxy whose processes are `every`."""
    args = budget_args(every)
    return {name: args for name in PORT_SCRIPTS}


def budget_args(every: list[int]) -> dict:
    """budget.bt's values: every process of the proxy (a connect may come from any), its listening
    ports and its network namespace (the inode of /proc/PID/ns/net)."""
    ports = sorted({l["local"].rsplit(":", 1)[-1] for l in sockets.listeners(every)}, key=int)
    try:
        netns = os.stat(f"/proc/{int(every[0])}/ns/net").st_ino
    except OSError:
        netns = 0
    return {"pids": every, "ports": ports[:MAX_PORTS], "netns": netns, "truncated": len(ports) > MAX_PORTS}


class own_clocks(contextlib.AbstractContextManager):
    """The watched proxy's own clocks over the window (its module's timing(), when it has one): started
    with the window, stopped at its end, its result stored as evidence; a module without one gives None."""

    def __init__(self, watched):
        make = getattr(watched, "timing", None)
        self.ctx = make() if make else None
        self.entered = None

    def start(self) -> None:
        if self.ctx is not None:
            self.entered = self.ctx.__enter__()

    def stop(self) -> None:
        if self.entered is not None:
            self.ctx.__exit__(None, None, None)

    def result(self):
        return self.entered.result() if self.entered is not None else None

    def __exit__(self, *exc):
        if self.entered is not None and exc[0] is not None:
            self.ctx.__exit__(*exc)
        return False


def loop_summary(ev: dict) -> dict:
    """Per-event costs of the event loop: events per wait, CPU per event, the CPU split."""
    b, w = ev["bpf"], ev.get("bpf_window_s") or ev["window_s"] or 1
    waits = (b.get("@epoll_calls", 0) or 0) + (b.get("@poll_calls", 0) or 0)
    events = (b.get("@epoll_events", 0) or 0) + (b.get("@poll_ready", 0) or 0)
    out = {"waits_per_s": round(waits / w, 1), "events_per_s": round(events / w, 1),
           "events_per_wait": round(events / waits, 2) if waits else None,
           "accepts_per_s": round((b["@fdok_accept"] or 0) / w, 1) if "@fdok_accept" in b else None,
           "cpu_cores": round(ev["cpu_cores"], 3),
           "cpu_us_per_event": round(ev["cpu_cores"] * w * 1e6 / events, 1) if events else None}
    if ev["perf"].get("available") and ev["perf"].get("split"):
        out["cpu_split"] = {k: round(v, 3) for k, v in ev["perf"]["split"].items()}
    return out


def diagnose(pids: list[int], duration: float, **kw) -> dict:
    ev = gather(pids, duration, **kw)
    if ev["all_exited"]:
        raise target.gone_error(pids, ev["exited"], duration)
    return answer(ev, pids)


def answer(ev: dict, pids: list[int]) -> dict:
    """The doctor's result from the evidence (pure: a recorded window gives the same answer)."""
    b = budget.compute(ev)
    found = proxies_findings.cpu_bound(proxies_findings.refine(findings.evaluate(ev), ev), ev)
    found = budget_findings.rank(found, budget_findings.evaluate(ev, b, found))
    limited = any(f["severity"] in ("high", "medium") for f in (x.to_json() for x in found))
    return {"target": {"pids": pids, "comm": ev["comm"], "exited": ev["exited"]},
            "window_s": round(ev["window_s"], 2),
            "findings": [f.to_json() for f in found],
            "verdict": "limited" if limited else "no limit found",
            "headroom": owncap.headroom(proxies_findings.caps(ev) if ev.get("proxy") else [], ev),
            "budget": b,
            "evidence": ev}

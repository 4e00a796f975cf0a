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
import subprocess
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
# Syscall scripts, each attached when the triage sees what it measures (or with --deep).
TRIAGED_SCRIPTS = ["pollscan", "fd_errors", "sync_calls"]
DEEP_SCRIPTS = ["connect_errors", "file_lifecycle", "epoll_events", "biolatency", "runqlat", "budget_reads"]


def port_range(pid: int) -> str | None:
    """The target's ip_local_port_range, read inside its network namespace."""
    try:
        p = subprocess.run(["nsenter", "-t", str(pid), "-n", "cat", "/proc/sys/net/ipv4/ip_local_port_range"],
                           capture_output=True, text=True, errors="replace", timeout=10)
        if p.returncode == 0:
            return " ".join(p.stdout.split())
    except subprocess.TimeoutExpired:
        pass
    try:
        return " ".join(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except OSError:
        return None


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
           cache_dirs: list[str] | None = None, deep: bool = False, use_perf: bool = True, tick=None) -> dict:
    """Run the probes for `duration` seconds against `pids`; return the evidence dict the rules read."""
    duration = target.duration(duration)
    caps.require_tracefs()
    if not bpftrace.version():
        raise ProxytuneError("bpftrace is not installed", "Debian: apt-get install bpftrace")
    triaged = triage.decide(pids)
    scripts, skipped = usable_scripts(deep, triaged["need"])
    watched = proxies.identify(pids[0])
    comm = procfs.comm_of(pids[0])
    profile_ref, service = proxies.audit_as(watched, profile_ref, comm)
    dirs = list(cache_dirs or []) or proxy_cache_dirs(watched)
    ev: dict = {"pids": pids, "comm": comm, "skipped_scripts": skipped, "triage": triaged,
                "scripts": [s.name for s in scripts], "port_range": port_range(pids[0])}
    every = list(dict.fromkeys(pids + (watched.processes() if watched else [])))
    sampler = connsample.Sampler(every, ev["port_range"], watched.worker_thread if watched else None)
    ev["audit"] = audit(host, profile_ref, service, dirs) if host is not None else {"available": False,
                                                                                    "reason": "not asked"}
    nspath = f"/proc/{pids[0]}/net/netstat"
    sampling = caps.perf_sampling() if use_perf else no("not asked (--no-perf)")
    with procgroup.Children() as kids, own_clocks(watched) as clocks:
        args = budget_args(every)
        run = bpftrace.Run(kids, bpftrace.compose(scripts, pids, {"budget": args, "budget_reads": args}))
        run.wait_attached()
        rec = perf.Record(kids) if sampling.ok else None
        stats0 = watched.stats() if watched else None
        watch = target.Watch(pids)
        before, ns0 = proc.snapshot(pids, watch.ids), netstat.snapshot(nspath)
        threads0 = proc.thread_times(sampler.pids)
        ct0, sched0 = nsstate.conntrack_stats(pids[0]), sched.snapshot(every)
        clocks.start()
        sampler.sample()
        window = watch.wait(duration, lambda t: (sampler.sample(), tick and tick(t)))
        sched1 = sched.snapshot(every)
        clocks.stop()
        after, ns1 = proc.snapshot(pids, watch.ids), (netstat.snapshot(nspath) if Path(nspath).exists() else ns0)
        sampler.window_end()                              # each listener's drops, against the same TcpExt window
        threads1 = proc.thread_times(sampler.pids)
        ev["kernel"] = nsstate.read(pids[0], ct0)         # sysctls, sockstat, conntrack of its namespace
        ev["proxy"] = ({**watched.describe(), "stats_before": stats0, "stats_after": watched.stats(),
                        "timing": clocks.result()} if watched else None)
        maps = run.stop()
        prof = rec.stop(pids) if rec else sampling.to_result()
    ev["window_s"] = window
    ev["sched"] = sched.delta(sched0, sched1, window)
    ev["bpf"] = {k: v for k, v in maps.items() if not k.startswith("_")}
    ev["bpftrace_stderr"] = maps.get("_stderr", "")
    ev["bpf_window_s"] = maps.get("_window_s") or window
    ev["netstat"] = netstat.delta(ns0, ns1)
    ev["exited"] = {str(p): s for p, s in watch.exited.items()}
    ev["all_exited"] = watch.all_gone
    ev["procs"], ev["cpu_cores"] = proc_figures(pids, before, after, window)
    ev["threads"] = proc.busiest_threads(threads0, threads1, pids[0])
    ev["listeners"] = sockets.listeners(pids)
    ev["connections"] = sockets.connections({l["local"].rsplit(":", 1)[-1] for l in ev["listeners"]}, pids)
    ev["conns"] = sampler.summary()
    ev["cache_dirs"] = observe.observe("", dirs, None)["cache_dirs"] if dirs else []
    ev["perf"] = prof
    ev["loop"] = loop_summary(ev)
    return ev


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


def budget_args(every: list[int]) -> dict:
    """budget.bt's values: every process of the proxy (a connect may come from any), its listening
    ports and its network namespace (the inode of /proc/PID/ns/net)."""
    ports = sorted({l["local"].rsplit(":", 1)[-1] for l in sockets.listeners(every)}, key=int)
    try:
        netns = os.stat(f"/proc/{int(every[0])}/ns/net").st_ino
    except OSError:
        netns = 0
    return {"pids": every, "ports": ports[:64], "netns": netns}


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

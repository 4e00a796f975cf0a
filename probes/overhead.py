"""What the doctor costs the proxy it watches: nginx's CPU time per request
under wrk, with and without `doctor` attached (bpftrace's default scripts
plus perf sampling), in interleaved runs (off/on, on/off, ...) so that drift
cancels. The BPF programs run in nginx's own context, so their cost lands
in nginx's system time, which is what this counts.

`component` attaches one part only (perf, bpftrace, one .bt script, or
nothing at all: the A/A control that shows the noise floor), so the cost
can be attributed with the same statistic (pairstats)."""

import contextlib
import re
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from proxytune.core import procfs, procgroup, rundir, stats
from proxytune.core.errors import ProxytuneError
from proxytune.core.numbers import is_uint
from proxytune.proxies.launch import wrk
from proxytune.proxies.nginx import NginxServer

from . import bpfstats, bpftrace, caps, doctor, hostnoise, pairstats, perf, proc, syscost, target, triage

PACE_MS = 1           # each wrk connection waits this long between requests: nginx below saturation, at a
                      # steady rate, so its CPU per request does not swing with how wrk batches (0: no pacing)

FIXED_COMPONENTS = {
    "doctor": "the doctor as `proxytune doctor` runs it: default bpftrace scripts and perf",
    "bpftrace": "the doctor without perf (--no-perf)",
    "perf": "perf record alone, as the doctor runs it",
    "perf-nocg": "perf record alone, without call graphs",
    "none": "nothing attached: an A/A control that measures the noise",
}


def components() -> dict[str, str]:
    """Every name `component` accepts, with what it attaches."""
    scripts = {n: f"bpftrace {n}.bt alone" for n in bpftrace.catalog()}
    return {**FIXED_COMPONENTS, **scripts}


def check_component(component: str) -> None:
    """Refuse a --component that names nothing attachable."""
    if component not in components():
        raise ProxytuneError(f"unknown --component {component!r}", "one of: " + ", ".join(components()))


def _cpu(pids: list[int]) -> float:
    """CPU seconds of every thread of pids, in the scheduler's nanoseconds (procfs.run_seconds)."""
    return sum(procfs.run_seconds(p) or 0.0 for p in pids)


def pace_script(directory: Path, pace_ms: int) -> str | None:
    """A wrk Lua script that makes each connection wait pace_ms between requests (None: no pacing)."""
    if not pace_ms:
        return None
    f = directory / "pace.lua"
    f.write_text(f"function delay() return {int(pace_ms)} end\n")
    return str(f)


def _window(pids: list[int], seconds: float, tick, component: str) -> None:
    """Attach `component` (not the whole doctor) for `seconds`; tick() once it is attached."""
    with procgroup.Children() as kids:
        run = rec = None
        if component in bpftrace.catalog():
            run = bpftrace.Run(kids, bpftrace.compose([bpftrace.catalog()[component]], pids, doctor.script_args(pids)))
            run.wait_attached()
        elif component in ("perf", "perf-nocg"):
            rec = perf.Record(kids, callgraph=component == "perf")
        target.Watch(pids).wait(seconds, tick)
        if run:
            run.stop(need_maps=False)           # only its cost counts here
        if rec:
            rec.stop(pids)


def _attach(component: str, pids: list[int], seconds: float, stacks: bool = True):
    """Start `component` in a thread; return (thread, started-event, result box); stacks=False: the
    doctor's perf without call graphs (doctor.gather)."""
    started, box = threading.Event(), {}

    def go():
        try:
            if component in ("doctor", "bpftrace"):
                box["evidence"] = doctor.gather(pids, seconds, tick=lambda t: started.set(),
                                                use_perf=component == "doctor", stacks=stacks)
            else:
                _window(pids, seconds, lambda t: started.set(), component)
        except BaseException as e:        # surfaced by the caller
            box["error"] = e
            started.set()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, started, box


@dataclass
class Load:
    """The load every run of one measurement gets: wrk against nginx, paced or not."""
    url: str
    pids: list[int]
    seconds: float
    connections: int
    script: str | None          # wrk Lua pacing script (pace_script), None: as fast as it goes


@contextlib.contextmanager
def attached(component: str | None, pids: list[int], seconds: float, stacks: bool = True):
    """`component` attached to pids for a window of `seconds` (None or "none": nothing);
    the body runs once it is attached and perf has started; leaving waits for the window's end.
    Yields a box that holds the doctor's evidence ("evidence") once the window closed."""
    if not component or component == "none":
        yield {}
        return
    t, started, box = _attach(component, pids, seconds, stacks)
    started.wait(60)
    if "error" in box:
        raise box["error"]
    time.sleep(0.5)                               # the window is open; perf has started
    yield box
    t.join()
    if "error" in box:
        raise box["error"]


def _one_run(load: Load, component: str | None) -> dict:
    """One wrk run with `component` attached (None: nothing); nginx's CPU per request."""
    with attached(component, load.pids, load.seconds + 3):
        c0, f0 = _cpu(load.pids), hostnoise.foreign_tracers()
        w = wrk(load.url, load.seconds, load.connections, script=load.script)
        c1, f1 = _cpu(load.pids), hostnoise.foreign_tracers()
    return {"requests": w["requests"], "rps": w["rps"], "nginx_cpu_s": c1 - c0,
            "cpu_us_per_request": (c1 - c0) * 1e6 / w["requests"] if w["requests"] else None,
            "foreign_tracers": sorted(set(f0) | set(f1))}


def measure(seconds: float = 10, reps: int = 6, connections: int = 50, progress=None, component: str = "doctor",
            pace_ms: int = PACE_MS, nice: int = hostnoise.NICE, mechanisms: bool = False) -> dict:
    """Interleaved wrk runs with and without `component`; or, with `mechanisms`, its unit costs
    and the cost per request they predict."""
    if component not in components():
        raise ProxytuneError(f"unknown component {component!r}", "one of: " + ", ".join(components()))
    with hostnoise.priority(nice) as in_effect, rundir.RunDir("overhead") as d, NginxServer(workers=1) as ng:
        load = Load(f"http://127.0.0.1:{ng.port}/", proc.resolve(ng.pid, None), seconds, connections,
                    pace_script(d.path, pace_ms))
        wrk(load.url, 2, connections, script=load.script)                      # warm-up
        if mechanisms:
            out = _mechanisms(load, reps, progress, component, d.path)
        else:
            out = _result(_runs(load, reps, progress, component))
        out["programs"] = program_costs(load, component)
    return {"bench": "doctor-overhead", "component": component, "attached": components()[component],
            "seconds": seconds, "reps": reps, "connections": connections, "pace_ms": pace_ms, "nice": in_effect,
            "scripts": doctor.DEFAULT_SCRIPTS, "perf": perf.describe(), **out}


ATTEMPTS = 3          # pairs tried per pair wanted, when other users' tracers spoil some


def _interleaved(reps: int, one, progress, key: str) -> list[dict]:
    """Pairs in alternating order (off/on, on/off, ...) so that drift cancels, until `reps` pairs
    ran with no foreign tracer, or ATTEMPTS * reps pairs were tried. one(mode) -> row.
    Sandwiches (off, on, off as one pair) were tried and were no better here: the host's noise is
    not a linear drift (docs/results/doctor-overhead-*sandwich.json)."""
    rows, clean, rep = [], 0, 0
    while clean < reps and rep < ATTEMPTS * reps:
        pair = [{"rep": rep, key: mode, **one(mode)} for mode in (("off", "on") if rep % 2 == 0 else ("on", "off"))]
        rows += pair
        clean += not any(r["foreign_tracers"] for r in pair)
        rep += 1
        if progress:
            progress()
    return rows


def _runs(load: Load, reps: int, progress, component: str) -> list[dict]:
    return _interleaved(reps, lambda mode: _one_run(load, component if mode == "on" else None), progress, "doctor")


def _mechanisms(load: Load, reps: int, progress, component: str, directory: Path) -> dict:
    """Unit costs (syscost) with `component` attached to nginx (idle meanwhile), in interleaved
    blocks; nginx's syscalls and context switches per request, counted on one more wrk run, and
    its CPU per request on a last one with nothing attached: the model's terms."""
    exe = syscost.compile_into(directory)

    def block(mode):
        with attached(component if mode == "on" else None, load.pids, 3):
            f0 = hostnoise.foreign_tracers()
            row = syscost.sample(exe)
            return {**row, "foreign_tracers": sorted(set(f0) | set(hostnoise.foreign_tracers()))}

    blocks = _interleaved(reps, block, progress, "mode")
    units, per_request, base = syscost.summarise(blocks), _per_request(load), _one_run(load, None)
    return {"mechanisms": {"blocks": blocks, "pairs_dropped": len(blocks) // 2 - units["syscall"]["pairs"],
                           "units": units, "nginx_per_request": per_request,
                           "nginx_alone": base,
                           "model": syscost.model(units, per_request, base["cpu_us_per_request"],
                                                  attached_tracepoints(component, load.pids))}}


def attached_tracepoints(component: str, pids: list[int]) -> list[str]:
    """The tracepoints `component` attaches (perf attaches none: it samples)."""
    return sorted({tp for s in bpf_scripts(component, pids) for tp in s.tracepoints})


def bpf_scripts(component: str, pids: list[int]) -> list[bpftrace.Script]:
    """The bpftrace scripts `component` attaches: the doctor's as it composes them for these pids (its
    triage decides which syscall scripts), one script, or none."""
    if component in ("doctor", "bpftrace"):
        return doctor.usable_scripts(need=triage.decide(pids)["need"])[0]
    return [bpftrace.catalog()[component]] if component in bpftrace.catalog() else []


def program_costs(load: Load, component: str) -> dict:
    """Each BPF program of `component`, attached to nginx under the same wrk load for one more
    run, with the kernel's per-program counters on (bpfstats): ns per run and runs per second.
    A window of its own: the counters' clock reads would inflate the cost measured elsewhere.
    Counts only the programs' bodies, not the tracepoint's or the syscall slow path's cost."""
    scripts = bpf_scripts(component, load.pids)
    if not scripts:
        return bpfstats.unavailable(f"{component} attaches no BPF program")
    caps.require_tracefs()
    with bpfstats.enabled() as why_not, procgroup.Children() as kids:
        if why_not:
            return bpfstats.unavailable(why_not)
        run = bpftrace.Run(kids, bpftrace.compose(scripts, load.pids, doctor.script_args(load.pids)))
        run.wait_attached()                     # until each tracepoint carries its program
        first, t0 = bpfstats.programs(run.proc.pid), time.monotonic()
        w = wrk(load.url, load.seconds, load.connections, script=load.script)
        last, seconds = bpfstats.programs(run.proc.pid), time.monotonic() - t0
        run.stop(need_maps=False)
    if not last:
        return bpfstats.unavailable("bpftrace's programs could not be read from /proc (fdinfo)")
    return {"available": True, "seconds": seconds, "nginx_requests_per_s": w["requests"] / seconds,
            "programs": bpfstats.rates(first, last, seconds)}


def _switches(pids: list[int]) -> int:
    return sum(procfs.context_switches(p) for p in pids)


def passive_opens() -> int | None:
    """Tcp PassiveOpens of our network namespace (/proc/net/snmp): connections accepted on it."""
    try:
        lines = Path("/proc/net/snmp").read_text().splitlines()
    except OSError:
        return None
    for head, vals in zip(lines[::2], lines[1::2]):
        if head.startswith("Tcp:") and "PassiveOpens" in head.split():
            v = vals.split()[head.split().index("PassiveOpens")]
            return int(v) if is_uint(v) else None
    return None


def _per_request(load: Load) -> dict:
    """nginx's syscalls (perf stat on raw_syscalls:sys_enter), context switches, TCP segments it read
    (tcp:tcp_rcv_space_adjust in its tasks: one per request/response round trip of its clients) and
    accepted connections (the namespace's PassiveOpens: nginx runs in ours, and other loads run in
    namespaces of their own) per request."""
    events = ("raw_syscalls:sys_enter", "tcp:tcp_rcv_space_adjust")
    with procgroup.Children() as kids:
        stat = kids.start(["perf", "stat", "-x,", "-e", ",".join(events), "-p", ",".join(map(str, load.pids))])
        time.sleep(1)
        s0, o0 = _switches(load.pids), passive_opens()
        w = wrk(load.url, load.seconds, load.connections, script=load.script)
        s1, o1 = _switches(load.pids), passive_opens()
        _, err = procgroup.stop(stat)
    counts = {e: next((int(l.split(",")[0]) for l in err.splitlines() if e in l and is_uint(l.split(",")[0])), None)
              for e in events}
    n = w["requests"] or None
    per = lambda v: v / n if v and n else None
    return {"requests": w["requests"], "syscall": per(counts["raw_syscalls:sys_enter"]),
            "context_switch": (s1 - s0) / n if n else None, "tcp_exchange": per(counts["tcp:tcp_rcv_space_adjust"]),
            "connection": (o1 - o0) / n if n and o0 is not None and o1 is not None else None}


def _result(rows: list[dict]) -> dict:
    kept = pairstats.clean(rows, "doctor")
    if not kept:
        raise ProxytuneError("another bpftrace or perf ran during every pair: nothing clean to compare",
                             "run again when no other tracer runs on the host")
    off = [r["cpu_us_per_request"] for r in kept if r["doctor"] == "off"]
    on = [r["cpu_us_per_request"] for r in kept if r["doctor"] == "on"]
    rps = lambda mode: statistics.median(r["rps"] for r in kept if r["doctor"] == mode)
    return {"runs": rows, "pairs_dropped": (len(rows) - len(kept)) // 2,
            "off_us_per_request": stats.summary(off), "on_us_per_request": stats.summary(on),
            **pairstats.summarise(off, on), "rps_off": rps("off"), "rps_on": rps("on")}

"""Where the doctor's cost comes from, measured where the noise is low: the
CPU time of one syscall and of one context switch (probes/syscost.c), with
and without a tracer attached, in interleaved blocks. Once any syscall
tracepoint is enabled every syscall of every task takes the slow path, and
sched_switch programs run at every context switch of the host, so these two
unit costs times nginx's syscalls and switches per request model what the
tracer adds to each request. A TCP round trip over loopback carries
what per-packet programs add (tcp:tcp_probe, tcp:tcp_rcv_space_adjust:
budget_reads.bt), times the segments nginx reads per request; one loopback
TCP connection opened, accepted and reset carries what programs on TCP
state changes (sock:inet_sock_set_state: connect_fail.bt, budget.bt) add,
times the connections nginx accepts per request (none while its clients
keep their connections alive). CPU time, not wall time: being preempted by
other work on a shared host does not count."""

import json
import subprocess
from pathlib import Path

from proxytune.core import cc
from proxytune.tune.datafiles import shipped
from proxytune.core.errors import ProxytuneError

from . import pairstats

SOURCE = "syscost.c"
UNITS = {"syscall": (200_000, 9), "switch": (20_000, 5), "exchange": (10_000, 5),    # operations per sample, samples
         "connect": (2_000, 5)}
CONNECT_SYSCALLS = 6        # socket, connect, accept, setsockopt, close, close: one connection of the unit


def compile_into(directory: Path) -> Path:
    """Build syscost.c into this run's private dir (it takes a fraction of a second)."""
    out = directory / "syscost"
    cmd = [cc.compiler(), *cc.cflags(), "-o", str(out), str(shipped("probes") / SOURCE)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise ProxytuneError(f"building syscost failed: {(p.stderr.strip().splitlines() or [''])[-1]}", " ".join(cmd))
    return out


def sample(exe: Path) -> dict[str, float]:
    """The fastest sample's ns of CPU per operation, for each unit, over one block: other work
    on the host (cache pollution, interrupts) only ever adds time, so the minimum is the
    cleanest figure, for the off and the on blocks alike."""
    out = {}
    for unit, (n, samples) in UNITS.items():
        p = subprocess.run([str(exe), unit, str(n), str(samples)], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise ProxytuneError(f"syscost {unit} failed: {p.stderr.strip()[-200:]}")
        out[unit] = min(json.loads(p.stdout)["ns"])
    return out


def _added(blocks: list[dict], unit: str) -> dict:
    off = [b[unit] for b in blocks if b["mode"] == "off"]
    on = [b[unit] for b in blocks if b["mode"] == "on"]
    added = pairstats.median_ci([b - a for a, b in zip(off, on)])
    return {"off_ns": pairstats.median_ci(off)["median"], "on_ns": pairstats.median_ci(on)["median"],
            "added_ns": added["median"], "added_ns_ci": added["ci"], "confidence": added["confidence"],
            "pairs": added["n"]}


def summarise(blocks: list[dict]) -> dict:
    """Per unit: off and on medians and the added ns (median of pair differences, sign-test CI).
    A round trip is two context switches and four syscalls, so one switch's share is derived,
    with an interval that takes the worst of both."""
    blocks = pairstats.clean(blocks)
    if not blocks:
        raise ProxytuneError("another bpftrace or perf ran during every pair: nothing clean to compare",
                             "run again when no other tracer runs on the host")
    out = {u: _added(blocks, u) for u in UNITS if all(u in b for b in blocks)}
    sc, sw = out["syscall"], out["switch"]
    out["context_switch"] = {"added_ns": (sw["added_ns"] - 4 * sc["added_ns"]) / 2,
                             "added_ns_ci": [(sw["added_ns_ci"][0] - 4 * sc["added_ns_ci"][1]) / 2,
                                             (sw["added_ns_ci"][1] - 4 * sc["added_ns_ci"][0]) / 2],
                             "derived": "(pipe round trip - 4 syscalls) / 2"}
    if "exchange" in out:
        ex = out["exchange"]
        out["tcp_exchange"] = {"added_ns": ex["added_ns"] - sw["added_ns"],
                               "added_ns_ci": [ex["added_ns_ci"][0] - sw["added_ns_ci"][1],
                                               ex["added_ns_ci"][1] - sw["added_ns_ci"][0]],
                               "derived": "TCP round trip - pipe round trip (the same switches and syscalls)"}
    if "connect" in out:
        cn, k = out["connect"], CONNECT_SYSCALLS
        out["connection"] = {"added_ns": cn["added_ns"] - k * sc["added_ns"],
                             "added_ns_ci": [cn["added_ns_ci"][0] - k * sc["added_ns_ci"][1],
                                             cn["added_ns_ci"][1] - k * sc["added_ns_ci"][0]],
                             "derived": f"loopback connection opened, accepted and reset - {k} syscalls"}
    return out


# The kernel paths the TCP units exercise, by tracepoint subsystem: a program elsewhere cannot run in them,
# so a component without one gets those units reported, not modelled (their noise is no cost of it).
PATHS = {"tcp_exchange": ("tcp:", "net:", "skb:"), "connection": ("sock:", "tcp:", "net:", "skb:")}


def relevant(tracepoints) -> list[str]:
    """The units a component with these tracepoints can add to: syscalls and switches always (a syscall
    tracepoint slows every syscall; sched_switch runs at every switch), the TCP units by PATHS."""
    tps = list(tracepoints or [])
    return ["syscall", "context_switch"] + [u for u, subs in PATHS.items() if any(t.startswith(subs) for t in tps)]


def model(units: dict, per_request: dict, cpu_us_per_request: float, tracepoints=None) -> dict:
    """The added CPU per request these unit costs predict, from nginx's syscalls, context switches,
    TCP round trips and accepted connections per request, for the units the component's tracepoints
    (None: every unit) can add to."""
    wanted = relevant(tracepoints) if tracepoints is not None else ["syscall", "context_switch", *PATHS]
    used = [u for u in wanted if per_request.get(u) is not None and u in units]
    ns = {u: units[u]["added_ns"] * per_request[u] for u in used}
    lo = sum(units[u]["added_ns_ci"][0] * per_request[u] for u in used)
    hi = sum(units[u]["added_ns_ci"][1] * per_request[u] for u in used)
    base = cpu_us_per_request * 1000
    return {"added_ns_per_request": ns, "overhead": sum(ns.values()) / base if base else None,
            "overhead_ci": [lo / base, hi / base] if base else None, "units_modelled": used}

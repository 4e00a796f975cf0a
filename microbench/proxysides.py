"""Two Squids kept running through a before/after comparison, one per side, each in a network
namespace of its own (so each has its own net.* values) and with its cache on a new filesystem of
its own, loaded in turn in steady windows.

Why: the report's Cooper section started a new Squid for every run it measured: start, fill,
1,000 idle clients, steady, exit; 2.5 s of each 6 s run was not the steady load (2026-11-28,
tools/cooper-phases). Kept alive, each side's Squid is started, filled and given its idle clients
once, and every window after that is the steady load alone. A side's net.* values cannot be
switched under a running Squid (somaxconn is read at listen(), the rest at each connect or SYN),
and a namespace has one set: hence a namespace per side (core/netns.py another(), enter()).
Both Squids sit on the CPU given to them, the load on the others; the side not loaded holds its
idle clients and serves nothing. Each window is measured as proxybench.run_store measures a run
(its access-log lines, descriptors, latency probe, cost, watch); what the side set up once (the
fill, the idle clients, the net.* values) is recorded on each of its windows, the idle clients as
held at that window's end.
Each cache is a new ext4 (a sparse image beside the docroot, through a loop device: its page cache
can be reclaimed, a tmpfs's could not), mounted in a mount namespace of this process's own: on the host's long-used /tmp, ext4's inode allocator (find_inode_bit,
recently_deleted) took 20-35 % of one side's samples and almost none of the other's, and which side
paid depended on where its directory fell (2026-11-28, perf in tools/cooper-phases); nothing of it
is seen on the host, and it all goes with the namespace, also when the run is killed.
"""

import contextlib
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from proxytune.core import mountns, netns
from proxytune.proxies.squid import SquidServer

from . import proxycost
from .proxybench import (LEVELS, REPEAT, FdPeak, IdleClients, _brief, _error_count, _errors, _nofile_of, access_log,
                         fd_warnings, latency_probe, lua_script, make_docroot, origin, run_wrk, squid_fd_pressure)


@dataclass
class _Side:
    """One side's Squid, set up and kept: what each of its windows is measured on."""
    name: str
    ns: int
    settle: object
    squid: SquidServer
    origin_port: int
    fill: dict
    idle: IdleClients
    limits: list | None
    cpus: list[int] | None
    windows: int = 0


def run(plan: dict, sides: dict, windows: list[dict], quiet: bool = False) -> dict:
    """sides: {name: {"nofile", "cpus", "settle"}}, settle() putting that side's net.* values in place
    (in its namespace) and returning them read back; windows: [{"side", "label", "watch", "round"?}] in
    the order they run. The first side named is set up in the calling thread's namespace, each other
    in a new one. The stores in the order they ran, each with its "set_up" (its side's values, read
    back as the window began); "watched": each perf-watched window's view, in order (a window the
    doctor watched keeps its budget on its store: its probes take CPU from the proxy they watch)."""
    from .runner import progress as progress_bar
    result = {"bench": "proxy", "quick": True, "plan": plan, "repeat": REPEAT, "stores": []}
    mountns.private()                   # first, while this process has no thread: each cache's disk is ours alone
    mountns.guard()                     # and what is left in it dies with us (Squid outlives a SIGKILL otherwise)
    home = netns.current()
    try:
        with tempfile.TemporaryDirectory(prefix="proxytune-proxysides-") as d, progress_bar(quiet) as bar, \
                contextlib.ExitStack() as stack:
            root = Path(d)
            task = bar.add_task("bench proxy", total=len(sides) + len(windows))
            result["docroot"] = make_docroot(root / "doc", plan["files"])
            kept: dict[str, _Side] = {}
            for i, (name, spec) in enumerate(sides.items()):
                bar.update(task, description=f"{name}: Squid, fill, idle clients")
                ns = home if i == 0 else netns.another()
                if ns != home:
                    stack.callback(_close_ns, ns, home)
                kept[name] = _set_up(stack, name, spec, ns, plan, root)
                bar.advance(task)
            for w in windows:
                side = kept[w["side"]]
                bar.update(task, description=f"{w['label']} #{side.windows + 1}: steady")
                result["stores"].append(_window(side, w, plan, root))
                bar.advance(task)
    finally:
        netns.enter(home)
        os.close(home)
    _sort_watched(result)
    return result


def _close_ns(ns: int, home: int) -> None:
    """Leave a side's namespace before its descriptor goes (the namespace ends with its last user)."""
    netns.enter(home)
    os.close(ns)


def _set_up(stack: contextlib.ExitStack, name: str, spec: dict, ns: int, plan: dict, root: Path) -> _Side:
    """In the side's namespace: its net.* values first (somaxconn is read when Squid listens), its
    origin, its Squid, one fill (not measured) and its idle clients, all kept until the end."""
    netns.enter(ns)
    spec["settle"]()
    og = stack.enter_context(origin(root / "doc"))
    cache = root / f"{name}-cache"
    cache.mkdir()
    mountns.fresh_ext4(root / f"{name}.img", _disk_mb(plan), cache, "proxy")
    stack.callback(mountns.detach, cache)
    sq = stack.enter_context(SquidServer("ufs", cache_mb=plan["cache_mb"], mem_mb=plan["mem_mb"], nofile=spec["nofile"],
                                         cpus=spec["cpus"], levels=LEVELS, cache_dir=cache))
    fill = run_wrk(f"127.0.0.1:{sq.port}", lua_script(root, og.port, plan["files"], f"{name}-f"), plan["fill_s"],
                   plan["concurrency"])
    idle = stack.enter_context(IdleClients("127.0.0.1", sq.port, og.port, plan["idle"]))
    cpus = sorted(os.sched_getaffinity(sq.pid)) if spec["cpus"] else None
    return _Side(name, ns, spec["settle"], sq, og.port, _brief(fill), idle, _nofile_of(sq.pid), cpus)


def _disk_mb(plan: dict) -> int:
    """A side's cache filesystem: the cache_dir's size and room for ext4's own (inodes, journal)."""
    return plan["cache_mb"] * 5 // 4 + 64


def _window(side: _Side, w: dict, plan: dict, root: Path) -> dict:
    """One steady window on a kept side, measured as proxybench.run_store measures a run: its own
    URLs (a new tag: the window starts with none of them cached), wrk and the latency probe, the
    access-log lines it added, the descriptors' peak, the cost, the watch (its attach before the load)."""
    netns.enter(side.ns)
    set_up = side.settle()
    side.windows += 1
    sq, watch, box = side.squid, w.get("watch"), {}
    mark = len(sq.log("access.log"))
    script = lua_script(root, side.origin_port, plan["files"], f"{side.name}-{side.windows}-s")
    around = watch.around(sq.pid, box) if watch else contextlib.nullcontext()
    with FdPeak(sq.pid) as fds, around, proxycost.Cost(sq.pid) as cost:
        probe: dict = {}
        t = threading.Thread(target=latency_probe, args=("127.0.0.1", sq.port, side.origin_port, plan["files"],
                                                         plan["steady_s"] - 1, probe), daemon=True)
        t.start()
        steady = run_wrk(f"127.0.0.1:{sq.port}", script, plan["steady_s"], plan["concurrency"])
        t.join()
    held, failed = side.idle.still_open(), dict(side.idle.failed)
    d = {"steady": steady, "idle_failed": failed, "idle_dropped": plan["idle"] - sum(failed.values()) - held}
    log = access_log(sq.log("access.log")[mark:])
    # served within the cost's window: wrk's and the probe's requests (the idle clients' were before it)
    served = steady["requests"] + sum((probe.get(k) or {}).get("n", 0) for k in ("hit", "miss"))
    limit = side.limits[0] if side.limits and isinstance(side.limits[0], int) else None
    return {"proxy": "squid", "store": "ufs", "nofile": side.limits, "label": w["label"], "side": side.name,
            "window": side.windows, "set_up": set_up, **({"round": w["round"]} if "round" in w else {}),
            "fd": {"peak": fds.peak, "pressure": squid_fd_pressure(limit, fds.peak) if limit else None},
            "fill": side.fill, "steady": _brief(steady), **({"cpus": side.cpus} if side.cpus else {}),
            "hit_ratio": log["hit_ratio"], "hit_ratio_from": "squid access.log", "byte_hit_ratio": log["byte_hit_ratio"],
            "service_ms": log["service_ms"], "codes": log["codes"],
            "errors": _errors(d, log["errors"], fd_warnings(sq.log("cache.log"))), "error_count": _error_count(
                steady, failed, d["idle_dropped"]), "latency_probe": probe, "cost": cost.result(served),
            **({"watched": watch.view(box, "squid (ufs, started by the report, under the mix)")} if watch else {})}


def _sort_watched(result: dict) -> None:
    """Each perf-watched window's view to result["watched"], in order, with its label; a window the
    doctor watched (probes.selfload.BudgetWatch) keeps its budget on its store instead."""
    result["watched"] = []
    for s in result["stores"]:
        if "watched" in s:
            w = s.pop("watched")
            if "budget" in w:
                s["budget"] = w.pop("budget")
                if w.get("budget_unavailable"):     # why not, said in the run's latency note
                    s["budget_unavailable"] = w["budget_unavailable"]
            else:
                result["watched"].append({**w, "label": s["label"]})

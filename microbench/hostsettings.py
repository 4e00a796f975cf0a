"""Cooper's host settings and the CPU-per-request split, measured by the report on Squids it
starts itself, without changing anything of the host.

Cooper (high-performance-squid-tuning-cooper.txt) doubled a tuned Squid's throughput with host
settings: the descriptor limit and the network backlogs. Here two Squids run side by side under
the same load, one per side, each kept running in a private network namespace of its own with only
loopback (core/netns.py, microbench/proxysides.py), with its cache on a new filesystem; their steady
windows alternate in rounds of a pair (before-after, then after-before: a drift of the host moves
both alike), Squid on a CPU of its own and the load (wrk, the origins, the idle clients) on the others:

- before: the fd limit Squid's service would get (Debian's squid.service sets none: systemd's
  soft default of 1024) and a new namespace's own defaults for net.*;
- after: the profile's LimitNOFILE, set on Squid's own child process (setrlimit, capped by our
  hard limit), and the profile's net.* sysctls, written inside its namespace only.

Each window is judged as Cooper's claim reads, by what the host served its clients (capacity()).
A warm-up window comes first and is not counted (_measure says why).
No global sysctl, no file under /etc, no journal entry, no mount seen by the host: the namespaces and
the processes go away. Every pair's windows are watched alike, by perf (`watch`, PerfWatch); their
CPU splits (kernel against the proxy's own code), one per window of the pairs, before and after
alike (the claim is of a proxy's CPU, whichever limit it runs at), are the second classic row: 6
windows in the quick report (10 with --full), enough for a verdict (reports/verdicts.py: 5 at least)
where the sides agree; its interval is over both sides' windows, and its reason gives each side's
range (2026-11-28, on new filesystems: before x2.5-2.7, Squid held at its descriptor limit; after
x0.95-1.3, more of its CPU in its own code). With a `budget_watch` (probes.selfload.BudgetWatch), the
warm-up window, a before side's and no pair's, is watched by the doctor: its time budget says where
that side's latency went (reports/latency.py: wrk waits there ~50x Squid's own clock, in the accept
queue of a Squid at its descriptor limit). The doctor is kept off the pairs because its probes do not
cost both sides alike: they take CPU from an after Squid that has none to spare and not from a before
one held back by its limit (2026-11-28, three reports at 460b555: the doctor-watched pairs x0.77,
x1.17, x0.92, the perf-watched ones x1.28-1.50)."""

import functools
import os
import resource

from proxytune.core import netns
from proxytune.core.errors import ProxytuneError

PROFILE = "linux/squid"
WARM_UP = "warm-up (not counted)"
ONLY = ("sysctl:net.*", "service:*")
# Short, but beyond 1024 descriptors: 400 busy clients and 1000 idle keep-alive ones each hold one
# client socket, and most of them a server one (Mogul: idle long-RTT clients are what labs miss).
# rounds: before/after pairs, alternating, each a steady window of one of the two Squids kept running
# (microbench/proxysides.py). A verdict on Cooper's row takes 5 pairs (reports/verdicts.py): the quick
# report's 3 give its figures and interval, --full's 5 its verdict; the pairs' windows give the CPU
# split a window each (6 quick, 10 full). cache_mb holds the wrk threads' repeated set (2 x 4,000 URLs
# of ~9 KB, proxybench.HISTORY) and every window's new objects (2026-11-28: at 32 MB, a kept Squid's
# hit ratio fell from 0.30 in its first window to 0.15 after it, against the mix's ~0.55; at 512 MB,
# 0.52-0.54 in every window); --full's windows outgrow even 1,024 MB, and the oldest windows' objects go.
# steady_s 2, not 3 (wrk takes whole seconds): the report's 60 s (issue 31 item 5) with the section's 7
# windows (3 s: 59.1-60.4 s a report, 2026-11-28); ~9,000-14,000 responses and ~400 perf samples of Squid
# a window (199 Hz), and 3 pairs are no verdict in the quick report either way (--full: 20 s, 5 pairs).
PLAN = {"files": 500, "cache_mb": 512, "mem_mb": 8, "fill_s": 1, "steady_s": 2, "concurrency": 400, "idle": 1000,
        "rounds": 3}
FULL = {**PLAN, "files": 3000, "cache_mb": 1024, "fill_s": 8, "steady_s": 20, "rounds": 5}


def run(host, profile_ref: str = PROFILE, quiet: bool = True, plan: dict | None = None, full: bool = False,
        watch=None, budget_watch=None) -> dict:
    """The before/after result, shaped as `bench proxy --compare-profile`'s (seeds.cooper reads it)
    plus its rounds; with a watch, each pair window's CPU split too; with a budget_watch (made with the
    steady phase's seconds), the warm-up window's time budget (reports/latency.py)."""
    if os.geteuid() != 0:
        raise ProxytuneError("Cooper's host settings need root (a private network namespace, Squid as its user)")
    return netns.call(_measure, host, profile_ref, dict(plan or (FULL if full else PLAN)), quiet, watch,
                      budget_watch)


def cpus() -> tuple[str, set[int]] | None:
    """(Squid's CPU, the load's CPUs): the proxy on the first CPU we may use, wrk, the origin and the
    idle clients on the others, so the comparison is of the proxy, not of scheduling; None on one CPU."""
    mine = sorted(os.sched_getaffinity(0))
    return (str(mine[0]), set(mine[1:])) if len(mine) >= 2 else None


def _measure(host, profile_ref: str, plan: dict, quiet: bool, watch, budget_watch=None) -> dict:
    """In the private namespaces: Squid as the service would run it (before) and with the profile's
    settings (after), in rounds of a pair of windows, alternating (BA in every other round)."""
    from proxytune.tune import backends, plan as plan_mod
    from . import proxybench, proxysides
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    pl = plan_mod.build(profile_ref, host, {"service": "squid"}, ONLY)
    before_nofile, after_nofile = proxybench.service_nofile(pl.changes, "squid")
    sysctl = backends.get(pl.os, "sysctl", host)
    changes = [c for c in pl.changes if c.setting.backend == "sysctl" and c.needed]
    # a new namespace's own values, exactly as the backend snapshots them: the before side's, never written
    snaps = {c.setting.key: sysctl.snapshot(c.setting.key) for c in changes}
    def settle(label: str) -> dict:
        """In this side's namespace: the after side's net.* values written (again: writing one that holds
        changes nothing), and the side's values read back (each window records them)."""
        for c in changes:
            if label == "after":
                sysctl.write(c.setting.key, c.target)
        return {c.setting.key: sysctl.snapshot(c.setting.key) for c in changes}
    nofile = {"before": (min(before_nofile, hard), hard), "after": (min(after_nofile, hard), hard)}
    pin = cpus()
    if pin:
        os.sched_setaffinity(0, pin[1])               # this process and all it starts: the load's CPUs
    sides = {side: {"nofile": nofile[side], "cpus": pin[0] if pin else None, "settle": functools.partial(settle, side)}
             for side in ("before", "after")}
    # a warm-up window first, on the before side, not counted, watched by the doctor: its time budget says
    # where that side's latency went (a Squid at its descriptor limit) and no pair's window pays its
    # probes (the first window of a section was not like the ones after it either: 2026-11-28, with a
    # new Squid a run, in 4 of 13 sections its goodput was 1,431-2,435/s against 750-1,400 after it)
    warm_watch = budget_watch(plan["steady_s"]) if budget_watch else None
    windows = [{"side": "before", "label": WARM_UP, "watch": warm_watch}] + [
        {"side": side, "label": side, "watch": watch, "round": r} for r in range(plan["rounds"])
        for side in (("before", "after") if r % 2 == 0 else ("after", "before"))]
    res = proxysides.run(plan, sides, windows, quiet)
    stores = res["stores"]
    for s in stores:
        s["capacity"] = capacity(s, plan)
    first = {lab: next(s for s in stores if s["label"] == lab) for lab in ("before", "after")}
    return {"bench": "proxy", "quick": True, "compare_profile": profile_ref, "proxy": "squid", "store": "ufs",
            "plan": plan, "repeat": proxybench.REPEAT, "docroot": res["docroot"],
            "where": "a private network namespace a side, with only loopback: nothing of the host changed",
            "cpus": {"squid": pin[0], "load": sorted(pin[1])} if pin else None,
            "service_nofile": {"before": before_nofile, "after": after_nofile, "hard_limit_here": hard,
                               "capped": after_nofile > hard},
            "applied": [f"RLIMIT_NOFILE {before_nofile} -> {min(after_nofile, hard)} on squid's own process"]
            + [f"{c.setting.key} {c.current} -> {c.target}" for c in changes],
            "sysctl_before": snaps, "rolled_back": True, "stores": stores, "before": first["before"], "after": first["after"],
            "rounds": [{"before": [i for i, s in enumerate(stores) if s.get("round") == r and s["label"] == "before"][0],
                        "after": [i for i, s in enumerate(stores) if s.get("round") == r and s["label"] == "after"][0]}
                       for r in range(plan["rounds"])],
            "cpu_split": {**res["watched"][0], "repeats": res["watched"]} if res["watched"] else None}


def capacity(store: dict, plan: dict) -> dict:
    """What the host served its client population in one run: the share of clients served (idle
    clients still held at the end; busy connections by the share of their requests answered, not
    refused or cut), goodput (successful responses/s: an HTTP error or a socket error is none), and
    served goodput, goodput x the share of idle clients held: a run that refused or dropped idle
    clients is credited only the share it held (refused clients cost a proxy nothing, so its raw
    req/s rise); the busy clients' failures are already out of goodput, so they count once."""
    st = store["steady"]
    seconds = st["requests"] / st["rps"] if st["rps"] else 0.0
    good = max(st["requests"] - st["http_errors"], 0)
    sock = sum(v for k, v in st["errors"].items() if k != "status")
    busy_ok = good / (good + st["http_errors"] + sock) if good + st["http_errors"] + sock else 0.0
    idle_failed = sum((store.get("errors") or {}).get("idle_clients_failed", {}).values())
    idle_dropped = max((store.get("errors") or {}).get("idle_clients_dropped", 0), 0)
    idle_held = max(plan["idle"] - idle_failed - idle_dropped, 0)
    clients = plan["concurrency"] + plan["idle"]
    share = (idle_held + plan["concurrency"] * busy_ok) / clients if clients else 0.0
    goodput = good / seconds if seconds else 0.0
    return {"clients": clients, "idle_held": idle_held, "busy_answered_share": round(busy_ok, 4),
            "served_share": round(share, 4), "goodput_rps": round(goodput, 1),
            "served_goodput_rps": round(goodput * (idle_held / plan["idle"] if plan["idle"] else 1.0), 1),
            "latency_us": st["latency_us"]}

"""Cooper's host settings and the CPU-per-request split, measured by the report on a Squid it
starts itself, without changing anything of the host.

Cooper (high-performance-squid-tuning-cooper.txt) doubled a tuned Squid's throughput with host
settings: the descriptor limit and the network backlogs. Here the same Squid and load run before
and after, in rounds of a pair that alternate (before-after, then after-before: a drift of the host
moves both alike), in a private network namespace with only loopback (core/netns.py), Squid on a
CPU of its own and the load (wrk, the origin, the idle clients) on the others:

- before: the fd limit Squid's service would get (Debian's squid.service sets none: systemd's
  soft default of 1024) and the namespace's own defaults for net.*;
- after: the profile's LimitNOFILE, set on Squid's own child process (setrlimit, capped by our
  hard limit), and the profile's net.* sysctls, written inside the namespace only.

Each run is judged as Cooper's claim reads, by what the host served its clients (capacity()).
A warm-up run comes first and is not counted (_measure says why).
No global sysctl, no file under /etc, no journal entry: the namespace and the processes go away.
Every pair's runs are watched alike, by perf (`watch`, PerfWatch); their CPU splits (kernel
against the proxy's own code), one per run of the pairs, before and after alike (the same Squid
under the same load: the claim is of a proxy's CPU, whichever limit it runs at), are the second
classic row: 6 windows in the quick report (10 with --full), enough for a verdict
(reports/verdicts.py: 5 at least); its interval is over both sides' windows, and its reason gives
each side's range. With a `budget_watch` (probes.selfload.BudgetWatch), the warm-up run, a before
side and no pair's, is watched by the doctor: its time budget says where that side's latency went (reports/latency.py: wrk waits
there ~50x Squid's own clock, in the accept queue of a Squid at its descriptor limit). The doctor
is kept off the pairs because its probes do not cost both sides alike: they take CPU from an after
Squid that has none to spare and not from a before one held back by its limit (2026-11-28, three
reports at 460b555: the doctor-watched pairs x0.77, x1.17, x0.92, the perf-watched ones x1.28-1.50)."""

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
# rounds: before/after pairs, alternating. A verdict on Cooper's row takes 5 pairs (reports/verdicts.py):
# the quick report's 3 (~16 s a pair) give its figures and interval, --full's 5 its verdict; the pairs'
# runs give the CPU split a window each (6 quick, 10 full).
PLAN = {"files": 500, "cache_mb": 32, "mem_mb": 8, "fill_s": 1, "steady_s": 3, "concurrency": 400, "idle": 1000,
        "rounds": 3}
FULL = {**PLAN, "files": 3000, "cache_mb": 256, "fill_s": 8, "steady_s": 20, "rounds": 5}


def run(host, profile_ref: str = PROFILE, quiet: bool = True, plan: dict | None = None, full: bool = False,
        watch=None, budget_watch=None) -> dict:
    """The before/after result, shaped as `bench proxy --compare-profile`'s (seeds.cooper reads it)
    plus its rounds; with a watch, each pair run's CPU split too; with a budget_watch (made with the
    steady phase's seconds), the warm-up run's time budget (reports/latency.py)."""
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
    """In the private namespace: Squid as the service would run it (before) and with the profile's
    settings (after), in rounds of a pair, alternating (BA in every other round)."""
    from proxytune.tune import backends, plan as plan_mod
    from . import proxybench
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    pl = plan_mod.build(profile_ref, host, {"service": "squid"}, ONLY)
    before_nofile, after_nofile = proxybench.service_nofile(pl.changes, "squid")
    sysctl = backends.get(pl.os, "sysctl", host)
    changes = [c for c in pl.changes if c.setting.backend == "sysctl" and c.needed]
    # the namespace's own values, exactly as the backend snapshots them, put back before each before run
    snaps = {c.setting.key: sysctl.snapshot(c.setting.key) for c in changes}
    def settle(label: str) -> dict:
        """Put this side's net.* values in place; the values read back (each run records them)."""
        for c in changes:
            if label == "after":
                sysctl.write(c.setting.key, c.target)
            elif snaps[c.setting.key] is not None:
                sysctl.restore(c.setting.key, snaps[c.setting.key])
        return {c.setting.key: sysctl.snapshot(c.setting.key) for c in changes}
    nofile = {"before": (min(before_nofile, hard), hard), "after": (min(after_nofile, hard), hard)}
    pin = cpus()
    if pin:
        os.sched_setaffinity(0, pin[1])               # this process and all it starts: the load's CPUs
    run = lambda side, w, label=None: {"label": label or side, "nofile": nofile[side], "cpus": pin[0] if pin else None,
                                       "before": functools.partial(settle, side), "watch": w}
    # a warm-up run first, not counted: the first Squid of a section is not like the ones after it
    # (2026-11-28: in 4 of 13 sections its goodput was 1,431-2,435/s against 750-1,400 after it, its
    # CPU split x1.25 against x2.4-4.3; every later run starts with the TIME_WAIT sockets of those
    # before it, 0 for the first, 6,000-20,000 after: /proc/net/sockstat in the namespace)
    # The doctor watches the warm-up: its time budget says where that run's latency went (a before side,
    # a Squid at its descriptor limit; the first run, so its figures are its own, not the pairs') and no
    # pair's side pays its probes; a run of its own cost ~9 s a report.
    warm_watch = budget_watch(plan["steady_s"]) if budget_watch else None
    runs = [run("before", warm_watch, WARM_UP)] + [{**run(side, watch), "round": r} for r in range(plan["rounds"])
                                                   for side in (("before", "after") if r % 2 == 0 else ("after", "before"))]
    res = proxybench.run_series(plan, runs, quiet)
    stores = res["stores"]
    for s, r in zip(stores, runs):
        s["capacity"] = capacity(s, plan)
        if "round" in r:
            s["round"] = r["round"]
    first = {lab: next(s for s in stores if s["label"] == lab) for lab in ("before", "after")}
    return {"bench": "proxy", "quick": True, "compare_profile": profile_ref, "proxy": "squid", "store": "ufs",
            "plan": plan, "repeat": proxybench.REPEAT, "docroot": res["docroot"],
            "where": "a private network namespace with only loopback: nothing of the host changed",
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

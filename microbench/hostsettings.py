"""Cooper's host settings and the CPU-per-request split, measured by the report on a Squid it
starts itself, without changing anything of the host.

Cooper (high-performance-squid-tuning-cooper.txt) doubled a tuned Squid's throughput with host
settings: the descriptor limit and the network backlogs. Here the same Squid and load run twice,
in a private network namespace with only loopback (core/netns.py):

- before: the fd limit Squid's service would get (Debian's squid.service sets none: systemd's
  soft default of 1024) and the namespace's own defaults for net.*;
- after: the profile's LimitNOFILE, set on Squid's own child process (setrlimit, capped by our
  hard limit), and the profile's net.* sysctls, written inside the namespace only.

No global sysctl, no file under /etc, no journal entry: the namespace and the processes go away.
During the after run's steady phase the doctor's perf watches Squid (`watch`, given by the report:
probes.selfload.PerfWatch): its CPU split (kernel against the proxy's own code) is the second classic
row.
"""

import os
import resource

from proxytune.core import netns
from proxytune.core.errors import ProxytuneError

PROFILE = "linux/squid"
ONLY = ("sysctl:net.*", "service:*")
# Short, but beyond 1024 descriptors: 400 busy clients and 1000 idle keep-alive ones each hold one
# client socket, and most of them a server one (Mogul: idle long-RTT clients are what labs miss).
PLAN = {"files": 500, "cache_mb": 32, "mem_mb": 8, "fill_s": 1, "steady_s": 4, "concurrency": 400, "idle": 1000}
FULL = {**PLAN, "files": 3000, "cache_mb": 256, "fill_s": 8, "steady_s": 20, "concurrency": 400, "idle": 1000}


def run(host, profile_ref: str = PROFILE, quiet: bool = True, plan: dict | None = None, full: bool = False,
        watch=None) -> dict:
    """The before/after result, shaped as `bench proxy --compare-profile`'s (seeds.cooper reads it);
    with a watch, the after run's CPU split too."""
    if os.geteuid() != 0:
        raise ProxytuneError("Cooper's host settings need root (a private network namespace, Squid as its user)")
    return netns.call(_measure, host, profile_ref, dict(plan or (FULL if full else PLAN)), quiet, watch)


def _measure(host, profile_ref: str, plan: dict, quiet: bool, watch) -> dict:
    """In the private namespace: Squid as the service would run it, then with the profile's settings."""
    from proxytune.tune import backends, plan as plan_mod
    from . import proxybench
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    pl = plan_mod.build(profile_ref, host, {"service": "squid"}, ONLY)
    before_nofile, after_nofile = proxybench.service_nofile(pl.changes, "squid")
    before = proxybench.run_plan(plan, ["ufs"], (min(before_nofile, hard), hard), quiet)
    written = []
    for c in pl.changes:
        if c.setting.backend == "sysctl" and c.needed:
            backends.get(pl.os, "sysctl", host).write(c.setting.key, c.target)
            written.append(f"{c.setting.key} {c.current} -> {c.target}")
    after = proxybench.run_plan(plan, ["ufs"], (min(after_nofile, hard), hard), quiet, watch=watch)
    return {"bench": "proxy", "quick": True, "compare_profile": profile_ref, "proxy": "squid", "store": "ufs",
            "plan": plan, "repeat": proxybench.REPEAT, "docroot": before["docroot"],
            "where": "a private network namespace with only loopback: nothing of the host changed",
            "service_nofile": {"before": before_nofile, "after": after_nofile, "hard_limit_here": hard,
                               "capped": after_nofile > hard},
            "applied": [f"RLIMIT_NOFILE {before_nofile} -> {min(after_nofile, hard)} on squid's own process"] + written,
            "rolled_back": True,
            "stores": before["stores"] + after["stores"], "before": before["stores"][0], "after": after["stores"][0],
            "cpu_split": after.get("watched")}

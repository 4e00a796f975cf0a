"""Varnish: `varnishd -f VCL -p param=value … -n WORKDIR`, varnishstat on its
shared memory (run with the target's credentials), and its thread cap.

How it counts and refuses (bin/varnishd/cache/cache_pool.c,
cache_wrk.c Pool_Task; varnishd(1) parameters thread_pool_max,
thread_queue_limit): each of thread_pools pools has at most
thread_pool_max workers; a session that finds no idle worker waits in the
pool's queue (sess_queued, thread_queue_len) up to thread_queue_limit, and
beyond it is dropped (sess_dropped); threads_limited counts the times the
pool wanted a thread it could not make.
"""

import json
import subprocess
from pathlib import Path

from proxytune.core.numbers import is_uint

from .. import targetread
from . import varnish_time
from ..owncap import Cap
from .base import STATS_SECONDS, Proxy, as_numbers, delta, nofile_now, option, peak

SOURCE = "varnish bin/varnishd/cache/cache_pool.c (Pool_Task), varnishd(1) thread_pool_max/thread_queue_limit"


class Varnish(Proxy):
    kind, exe_names = "varnish", ("varnishd",)
    unit, user, package = "varnish", "vcache", "varnish"
    service_user = "varnish"
    DEFAULTS = {"thread_pools": 2, "thread_pool_max": 5000, "thread_pool_min": 100, "thread_queue_limit": 20}
    VARNISHSTAT = "/usr/bin/varnishstat"
    worker_thread = "cache-worker"              # bin/varnishd/cache/cache_wrk.c names its workers so
    stores = ("malloc", "file")
    store_design = {"malloc": "objects in memory (malloc)",
                    "file": "objects in one mmap'd file, written back by the page cache"}

    @staticmethod
    def bench(store, plan, origin_port, nofile):
        from proxytune.microbench import proxyservers
        return proxyservers.Varnish(origin_port, store, plan["cache_mb"], nofile=nofile)

    def config_arg(self):
        return (option(self.argv, "-f") or ["/etc/varnish/default.vcl"])[0]

    def parse(self):
        params = {}
        for p in option(self.argv, "-p"):
            k, _, v = p.partition("=")
            if k in self.DEFAULTS and is_uint(v):
                params[k] = {"value": v, "line": None, "where": "varnishd command line (-p)"}
        for k, v in self.DEFAULTS.items():
            params.setdefault(k, {"value": str(v), "line": None, "where": "varnishd default"})
        params["-s"] = {"value": ", ".join(option(self.argv, "-s")) or "default", "line": None}
        params["-a"] = {"value": ", ".join(option(self.argv, "-a")) or ":80", "line": None}
        return params

    def workdir(self) -> str | None:
        n = option(self.argv, "-n")
        return n[0] if n and n[0].startswith("/") and not any(ord(c) < 32 for c in n[0]) else None

    def stats(self):
        """varnishstat on the target's shared memory, run with the target's credentials (its -n
        workdir is the target's to name, not root's to open)."""
        exe, creds = self.VARNISHSTAT, targetread.run_as(self.pid, self.proc)
        if not Path(exe).exists() or creds is None:
            return {"available": False, "reason": "varnishstat is not installed" if creds is not None else "gone"}
        argv = [exe, "-1", "-j"] + (["-n", self.workdir()] if self.workdir() else [])
        try:
            p = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=STATS_SECONDS * 3,
                               cwd="/", **creds)
            doc = json.loads(p.stdout) if p.returncode == 0 else None
            counters = doc.get("counters", doc) if isinstance(doc, dict) else None
        except (subprocess.TimeoutExpired, OSError, ValueError):
            counters = None
        if not isinstance(counters, dict):
            return {"available": False, "reason": "varnishstat could not read the shared memory"}
        keep = ("MAIN.threads", "MAIN.threads_limited", "MAIN.threads_failed", "MAIN.thread_queue_len",
                "MAIN.sess_queued", "MAIN.sess_dropped", "MAIN.sess_conn", "MAIN.sess_fail", "MAIN.client_req")
        return {"available": True, "source": "varnishstat -j",
                **as_numbers({k: (counters.get(k) or {}).get("value") if isinstance(counters.get(k), dict) else None
                              for k in keep}, keep)}

    def timing(self):
        return varnish_time.timing(self)

    def config_origins(self) -> dict:
        return varnish_time.config_origins(self.lines, option(self.argv, "-b"))

    time_parts = staticmethod(varnish_time.parts)

    @staticmethod
    def caps(ev: dict) -> list[Cap]:
        p = ev["proxy"]
        d = {**{k: {"value": str(v), "where": "varnishd default"} for k, v in Varnish.DEFAULTS.items()},
             **p["directives"]}
        pools, tmax = int(d["thread_pools"]["value"]), int(d["thread_pool_max"]["value"])
        qlen = peak(p, "MAIN.thread_queue_len") or 0
        # sess_queued alone is no cap: below thread_pool_max a session also waits while the herder breeds
        refused = {k: delta(p, f"MAIN.{k}") or 0 for k in ("threads_limited", "sess_dropped")}
        src = d["thread_pool_max"].get("where")
        used, counted = peak(p, "MAIN.threads"), "MAIN.threads (varnishstat)"
        if used is None:            # no varnishstat: its cache-worker threads in /proc
            named = [v.get("workers_peak") for v in ((ev.get("conns") or {}).get("pids") or {}).values()]
            used = sum(v for v in named if isinstance(v, int)) if any(isinstance(v, int) for v in named) else None
            counted = "cache-worker threads in /proc (varnishstat not available)"
        return [Cap("varnish-thread-pool", "varnish", f"worker threads ({pools} pools x thread_pool_max {tmax})",
                    f"thread_pool_max {tmax} ({src})", pools * tmax, src, used, counted, pools * tmax,
                    "sessions wait in the pool's queue (thread_queue_limit "
                    f"{d['thread_queue_limit']['value']}) and beyond it are dropped (sess_dropped)", SOURCE,
                    f"raise thread_pool_max (now {tmax}, {src}): `varnishd -p thread_pool_max=N` or `varnishadm "
                    "param.set thread_pool_max N` (default 5000); slow backends hold workers: check them too",
                    refused=refused, extra={"sess_queued": delta(p, "MAIN.sess_queued"),
                                            "thread_queue_len_peak": qlen})]

    @staticmethod
    def fd_fix(p: dict) -> str:
        return ("raise varnish's LimitNOFILE (Debian's unit has 131072; profile linux/varnish) and restart it: "
                f"varnishd passes its limit to the cache child; {nofile_now(p)}")

    @staticmethod
    def backlog_fix(p: dict) -> str:
        return ("varnish: `varnishd -p listen_depth=8192` (default 1024), capped by net.core.somaxconn "
                "(profile linux/varnish)")

    @staticmethod
    def port_fix(p: dict) -> str:
        return ("let varnish reuse backend connections (it keeps them by default: check `Connection: close` from "
                "the backend and the backend's keep-alive); `.max_connections` in the backend caps how many it "
                "opens")

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

from proxytune.core import targetread
from proxytune.core.errors import ProxytuneError
from proxytune.core.numbers import is_uint

from .base import STATS_SECONDS, Running, Spec, as_numbers, delta, nofile_now, option, peak
from . import varnish_time
from .cap import Cap
from .launch import Server, free_port, limited, need, tempdir

SOURCE = "varnish bin/varnishd/cache/cache_pool.c (Pool_Task), varnishd(1) thread_pool_max/thread_queue_limit"


class RunningVarnish(Running):
    DEFAULTS = {"thread_pools": 2, "thread_pool_max": 5000, "thread_pool_min": 100, "thread_queue_limit": 20}
    VARNISHSTAT = "/usr/bin/varnishstat"

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

# Varnish's own counts of what it failed to serve (varnish-counters(7)): a fetch that failed (a streamed
# body is then cut short, which the client sees as a read error), a fetch that could not get storage
# after nuke_limit evictions, sessions dropped for want of a thread, sessions closed on an error.
FAILURES = ("MAIN.fetch_failed", "MAIN.n_lru_limited", "MAIN.sess_dropped", "MAIN.sess_closed_err")


class Varnish(Spec, process=RunningVarnish):
    kind, exe_names = "varnish", ("varnishd",)
    order = 40
    unit, user, package = "varnish", "vcache", "varnish"
    service_user = "varnish"
    DEFAULTS = RunningVarnish.DEFAULTS
    worker_thread = "cache-worker"              # bin/varnishd/cache/cache_wrk.c names its workers so
    stores = ("malloc", "file")
    store_design = {"malloc": "objects in memory (malloc)",
                    "file": "objects in one mmap'd file, written back by the page cache"}
    hit_ratio_from = "varnishstat MAIN.cache_hit/cache_miss"

    @staticmethod
    def launch(store, plan, origin_port, nofile, device=None):
        return VarnishServer(origin_port, store, plan["cache_mb"], nofile=nofile)

    @staticmethod
    def counters(server) -> dict:
        st = server.stats()
        return {"hits": st.get("MAIN.cache_hit", 0), "misses": st.get("MAIN.cache_miss", 0)}

    @staticmethod
    def failures(server) -> dict:
        st = server.stats()
        return {k: st.get(k, 0) for k in FAILURES}

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


class VarnishServer(Server):
    """varnishd -F with one storage (malloc or file), a VCL that sets X-Cache, and optional -p params."""

    def __init__(self, origin_port: int, store: str = "malloc", cache_mb: int = 256, params: dict | None = None,
                 nofile: tuple | None = None):
        if store not in ("malloc", "file"):
            raise ProxytuneError(f"unknown varnish storage {store!r}", "malloc or file")
        self.exe = need("varnishd", Varnish.package)
        self.dir, self.port = tempdir("varnish"), free_port()
        self.workdir = self.dir / "work"
        self.store = store
        self.storage = f"malloc,{cache_mb}m" if store == "malloc" else f"file,{self.dir / 'storage.bin'},{cache_mb}m"
        # idle keep-alive clients are held 2 minutes, as Squid and Traffic Server do (varnishd's default: 5 s)
        self.params, self.nofile = {"timeout_idle": 120, **(params or {})}, nofile
        # varnishd has no DNS client: the backend and -a addresses are IP literals, which getaddrinfo
        # turns into addresses without a lookup (vcl(7) "Backend definition": .host)
        (self.dir / "default.vcl").write_text(
            f'vcl 4.1;\nbackend origin {{ .host = "127.0.0.1"; .port = "{origin_port}"; }}\n'
            'sub vcl_deliver { if (obj.hits > 0) { set resp.http.X-Cache = "HIT"; } '
            'else { set resp.http.X-Cache = "MISS"; } }\n')

    def __enter__(self):
        argv = [self.exe, "-F", "-n", str(self.workdir), "-a", f"127.0.0.1:{self.port}", "-T", "none",
                "-f", str(self.dir / "default.vcl"), "-s", self.storage, "-j", "unix,user=vcache"]
        for k in sorted(self.params, key=lambda k: k != "thread_pool_min"):    # min before max: max >= min
            argv += ["-p", f"{k}={self.params[k]}"]
        self._launch(limited(argv, self.nofile), timeout=60)
        return self

    def stats(self) -> dict:
        p = subprocess.run([need("varnishstat", Varnish.package), "-n", str(self.workdir), "-1", "-j"],
                           capture_output=True, text=True, timeout=30)
        doc = json.loads(p.stdout) if p.returncode == 0 else {}
        return {k: v.get("value") for k, v in doc.get("counters", {}).items()}

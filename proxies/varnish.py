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
import re
import subprocess
from pathlib import Path

from proxytune.core import targetread
from proxytune.core.errors import ProxytuneError
from proxytune.core.numbers import is_uint, uint

from .base import STATS_SECONDS, Running, Spec, as_numbers, delta, nofile_now, option, peak
from .timing import (MAX_VALUES, CoProcess, Sampler, Unavailable, Window, address, answer, digest, nothing,
                     origin_entry, part, split_address, unmeasurable)
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
        return own_clock(self)

    def config_origins(self) -> dict:
        return clock_origins(self.lines, option(self.argv, "-b"))


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

    @staticmethod
    def time_parts(p: dict) -> dict:
        """What its own clocks show of the window (clock_parts below)."""
        return clock_parts(p)

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


# ---------------------------------------------------------------- its own clocks (issue 28)
#
# Varnish's own clocks: the Timestamp records of its shared-memory log
# over the window (varnishlog as a co-process, with the target's
# credentials), and its pool's queue read with varnishstat.
#
# Timestamps (varnish 7.1 doc/sphinx/reference/vsl.rst TIMESTAMPS; each
# record is `Label: absolute since-start since-last`): a client request has
# Start (first byte received), Req, Waitinglist (came off a busy object's
# waiting list), Fetch, Process, Resp (delivered); a backend fetch has
# Start, Fetch, Connected (a new or a pooled connection:
# bin/varnishd/cache/cache_backend.c vbe_dir_getfd), Bereq (request sent),
# Beresp (response headers received), BerespBody. So Beresp's since-last is
# the origin's first byte, Connected's the connection, Resp's since-start
# the request's time inside varnish. BackendOpen names the backend and its
# address for each fetch (`fd name ip port local-ip local-port connect|reuse`).
#
# The pool's queue (bin/varnishd/cache/cache_wrk.c Pool_Task): a task (a
# new session, one back from the waiter, a fetch) that finds no idle worker
# waits in the pool's queue; client tasks beyond thread_pool_max +
# thread_queue_limit - running threads are dropped (sess_dropped). No record
# says how long one waited: MAIN.thread_queue_len, the queues' total length,
# is set once a second by the pool herder (cache_pool.c pool_poolherder),
# so the wait per request is Little's law on it: the mean length over the
# window x the window / the requests in it. sess_queued is added to the
# shared counters by the herder only while a pool has more threads than
# thread_pool_min (cache_wrk.c pool_herder): evidence, not the measure.

VARNISHLOG = "/usr/bin/varnishlog"
LOG_CAP = 24 << 20              # bytes of varnishlog output read per window (about 75,000 requests that fetch)
CLIENT_LABELS, BACKEND_LABELS = ("Resp", "Waitinglist"), ("Connected", "Beresp")   # what read_log uses
LABELS = CLIENT_LABELS + BACKEND_LABELS
SAMPLE_EVERY = 0.5
QUEUE_FIELDS = ("MAIN.thread_queue_len", "MAIN.sess_queued", "MAIN.sess_dropped", "MAIN.req_dropped",
                "MAIN.busy_sleep", "MAIN.threads", "MAIN.threads_limited", "MAIN.client_req")
# Only the records read_log uses, found by one scan of the whole text (a loaded window is ~20 MB; a
# Python loop over every line cost 2.4 s of a 17 s doctor look): client Resp (since start) and
# Waitinglist (since last), backend Connected and Beresp (since last), backend BackendOpen (origin).
_NUM = r"-?[0-9]{1,9}\.[0-9]{1,9}"
WANTED = re.compile(
    r"^ *([0-9]{1,12}) (?:"
    rf"Timestamp +(?:(c) ({'|'.join(CLIENT_LABELS)})|(b) ({'|'.join(BACKEND_LABELS)})): [0-9]{{1,12}}\.[0-9]{{1,9}} "
    rf"({_NUM}) ({_NUM})"
    r"|BackendOpen +b [0-9]{1,9} (\S{1,128}) ([0-9A-Fa-f.:]{2,45}) ([0-9]{1,5}) \S{1,45} [0-9]{1,5} (?:connect|reuse)"
    r")$", re.A | re.M)
# a session waits in the pool's queue before a worker reads its request: the kernel sees that wait as
# client data not yet read (the budget's proxy_self), so it must not be added twice
OVERLAPS = "proxy_self: client data not yet read (the session is queued before its request is read)"
MECH = "varnish shared-memory log, Timestamp records (doc/sphinx/reference/vsl.rst TIMESTAMPS)"


def varnishstat(proxy) -> dict:
    """The pool's queue fields of varnishstat, with the target's credentials; {} when unreadable."""
    creds = targetread.run_as(proxy.pid, proxy.proc)
    if creds is None or not Path(proxy.VARNISHSTAT).exists():
        return {}
    import subprocess
    argv = [proxy.VARNISHSTAT, "-1", "-j", *(a for f in QUEUE_FIELDS for a in ("-I", f))]
    argv += ["-n", proxy.workdir()] if proxy.workdir() else []
    p = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=STATS_SECONDS * 3, cwd="/",
                       **creds)
    doc = json.loads(p.stdout) if p.returncode == 0 else {}
    counters = doc.get("counters", doc) if isinstance(doc, dict) else {}
    return {k: v["value"] for k in QUEUE_FIELDS if isinstance(v := counters.get(k), dict)
            and isinstance(v.get("value"), int) and not isinstance(v.get("value"), bool)}



def read_log(text: str) -> dict:
    """The window's requests and fetches from varnishlog -g raw lines: per client request its time
    inside varnish and its wait on a waiting list; per backend fetch its connection and first byte,
    by backend."""
    fetches: dict[int, dict] = {}
    total, waiting = [], []
    for m in WANTED.finditer(text):
        vxid, client, backend, since_start, since_last, origin = m.group(1, 3, 5, 6, 7, 8)
        if origin:
            fetches.setdefault(int(vxid), {})["origin"] = (origin, f"{m.group(9)}:{m.group(10)}")
        elif client == "Resp" and len(total) < MAX_VALUES:
            total.append(float(since_start) * 1000)
        elif client == "Waitinglist" and len(waiting) < MAX_VALUES:
            waiting.append(float(since_last) * 1000)
        elif backend and len(fetches) < MAX_VALUES:
            fetches.setdefault(int(vxid), {})[backend] = float(since_last) * 1000
    by: dict[str, dict] = {}
    every = {"connect": [], "first_byte": []}
    for f in fetches.values():
        name, addr = f.get("origin") or ("unknown", "unknown")
        o = by.setdefault(addr, {"name": name, "connect": [], "first_byte": []})
        for key, label in (("connect", "Connected"), ("first_byte", "Beresp")):
            if label in f:
                o[key].append(f[label])
                every[key].append(f[label])
    return {"requests": len(total), "total": digest(total), "waitinglist": digest(waiting),
            "connect": digest(every["connect"]), "first_byte": digest(every["first_byte"]),
            "origins": {a: {"name": o["name"][:128], "connect": digest(o["connect"]),
                            "first_byte": digest(o["first_byte"])} for a, o in list(by.items())[:64]}}


class Clock(Window):
    def __init__(self, proxy, creds: dict):
        super().__init__(proxy)
        self.creds, self.log, self.sampler = creds, None, None
        self.source = ("varnishlog -g raw (Timestamp Resp, Waitinglist, Connected, Beresp; BackendOpen) and "
                       "varnishstat (the pool's queue)")

    def begin(self):
        self.data["backends"] = backend_lines(self.proxy.lines)
        self.data["queue_start"] = varnishstat(self.proxy)
        # -I keeps only the Timestamp labels read_log reads: a fifth of -i Timestamp's bytes (7.7 MB -> 1.7 MB
        # for one second of wrk on this host), so less to read, to parse and to cut at LOG_CAP
        argv = [VARNISHLOG, "-g", "raw", "-i", "BackendOpen", "-I", f"Timestamp:^({'|'.join(LABELS)}):"]
        argv += ["-n", self.proxy.workdir()] if self.proxy.workdir() else []
        self.log = CoProcess(argv, self.creds, LOG_CAP)
        self.sampler = Sampler(lambda: varnishstat(self.proxy).get("MAIN.thread_queue_len"), SAMPLE_EVERY).start()

    def end(self):
        if self.sampler:
            self.data["queue_samples"] = [v for v in self.sampler.stop() if isinstance(v, int)]
        self.data["queue_end"] = varnishstat(self.proxy)
        if self.log:
            self.data["log"] = read_log(self.log.stop())
            self.data["log_truncated"] = self.log.truncated
            self.data["reader_cpu_s"] = self.log.used_cpu_s          # varnishlog's own CPU in the window


def own_clock(proxy) -> Window:
    creds = targetread.run_as(proxy.pid, proxy.proc)
    if creds is None:
        return Unavailable(proxy, "the varnishd process is gone")
    if not Path(VARNISHLOG).exists():
        return Unavailable(proxy, f"{VARNISHLOG} is not installed: varnish's shared-memory log is not readable")
    return Clock(proxy, creds)


# ---------------------------------------------------------------- pure

def clock_parts(p: dict) -> dict:
    t = p.get("timing") or {}
    log = t.get("log") or {}
    if not t.get("available") or not log:
        return nothing(t.get("reason") or "varnish's shared-memory log was not read in this window", MECH)
    n = log.get("requests") or 0
    source = "varnishlog: client requests delivered in the window (Timestamp Resp)"
    if not n:
        return {**nothing("varnishlog saw no client request finish in the window", MECH), "requests": {
            "n": 0, "source": source}}
    cut = " (varnishlog's output was capped: the window's first requests only)" if t.get("log_truncated") else ""
    where = t.get("backends") or {}
    out = {}
    for name, key, what in (("origin_connect", "connect", "Connected since Fetch: a new connection or one from "
                             "the pool"), ("origin_first_byte", "first_byte", "Beresp since Bereq: the backend's "
                                           "response headers after the request was sent")):
        every = log.get(key) or {}
        fetched = every.get("n") or 0
        by = {(split_address(addr) or addr): origin_entry(f"backend {o['name']}",
                                                         where.get(o["name"].rsplit(".", 1)[-1]),
                                                         o[key]["sum_ms"] / o[key]["n"], o[key]["n"])
              for addr, o in (log.get("origins") or {}).items() if o[key]["n"]}
        out[name] = (part(every["sum_ms"] / fetched, f"{MECH}: {what}",
                          "µs timestamps, each backend fetch of the window" + cut, samples=fetched,
                          requests=min(fetched, n), population="requests that went to a backend (fetches)",
                          by_origin=by, p50=every["p50"], p99=every["p99"])
                     if fetched else unmeasurable("no backend fetch in the window: every request was a hit", MECH))
    tot = log["total"]
    total = part(tot["sum_ms"] / n, f"{MECH}: Resp since Start (first byte received to delivered)",
                 "µs timestamps, each client request of the window" + cut, samples=n, requests=n,
                 p50=tot["p50"], p99=tot["p99"])
    out["proxy_queue"] = _queue(p, t, n)
    return answer(out, total, n, source)


def backend_lines(lines) -> dict:
    """backend name -> file:line of `backend NAME {` in the VCL read (VCL includes are not followed)."""
    return {m.group(1): f"{ln.file}:{ln.number}" for ln in lines[:5000]
            if (m := re.match(r"\s*backend\s+([A-Za-z0-9_]{1,64})\s*\{", ln.text, re.A))}


def _queue(p: dict, t: dict, n: int) -> dict:
    """Little's law on the sampled thread_queue_len, plus the waiting list (busy objects)."""
    samples = [*(v for v in [(t.get("queue_start") or {}).get("MAIN.thread_queue_len")] if isinstance(v, int)),
               *t.get("queue_samples", []),
               *(v for v in [(t.get("queue_end") or {}).get("MAIN.thread_queue_len")] if isinstance(v, int))]
    window = t.get("window_s") or 0
    wait = t["log"]["waitinglist"]
    if not samples or not window:
        return unmeasurable("MAIN.thread_queue_len was not read (varnishstat)", "varnishstat")
    mean_len = sum(samples) / len(samples)
    little = mean_len * window * 1000 / n
    a, b = t.get("queue_start") or {}, t.get("queue_end") or {}
    grew = {k.split(".")[1]: b[k] - a[k] for k in ("MAIN.sess_queued", "MAIN.sess_dropped", "MAIN.req_dropped",
                                                   "MAIN.busy_sleep", "MAIN.threads_limited")
            if isinstance(a.get(k), int) and isinstance(b.get(k), int)}
    d = p.get("directives") or {}
    val = lambda k: (d.get(k) or {}).get("value")
    src = (d.get("thread_pool_max") or {}).get("where") or "varnishd default"
    cause = {"what": "the worker pools' queue",
             "directive": f"thread_pool_max {val('thread_pool_max')} x thread_pools {val('thread_pools')}, "
                          f"thread_queue_limit {val('thread_queue_limit')}", "where": src,
             "limit": _int(val("thread_pool_max")) * _int(val("thread_pools")) if val("thread_pools") else None,
             "queue_now": samples[-1], "queue_max": max(samples), "threads": b.get("MAIN.threads"),
             "counted_in_window": grew}
    return part(little + wait["sum_ms"] / n,
                "varnishstat MAIN.thread_queue_len (Little's law: mean length x window / requests; cache_wrk.c "
                "Pool_Task) + Waitinglist timestamps (busy objects)",
                f"the pool herder sets the length once a second ({len(samples)} readings in the window)",
                samples=len(samples), requests=n, cause=cause, overlaps=OVERLAPS, overlap_ms=little,
                check={"little_ms": round(little, 3), "queue_mean": round(mean_len, 2),
                                               "waitinglist_ms": round(wait["sum_ms"] / n, 3)})


def _int(v) -> int:
    return uint(v) or 0


def clock_origins(lines, argv_backend: list[str]) -> dict:
    """VCL `backend NAME { .host = "IP"; .port = "N"; }` (and varnishd -b IP:PORT): IP:PORT -> name."""
    out, cur = {}, None
    for ln in lines[:5000]:
        m = re.match(r"\s*backend\s+([A-Za-z0-9_]{1,64})\s*\{", ln.text, re.A)
        if m:
            cur = {"name": f"backend {m.group(1)}", "where": f"{ln.file}:{ln.number}"}
        if cur is not None:
            for k, v in re.findall(r"\.(host|port)\s*=\s*\"([^\"]{1,64})\"", ln.text):
                cur[k] = v
            if "host" in cur and "port" in cur:
                if addr := address(cur["host"], cur["port"]):
                    out.setdefault(addr, {"name": cur["name"], "where": cur["where"]})
                cur = None
    for b in argv_backend[:8]:
        if addr := split_address(b):
            out.setdefault(addr, {"name": "varnishd -b", "where": "varnishd command line (-b)"})
    return out


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

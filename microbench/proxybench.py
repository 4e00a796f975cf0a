"""`bench proxy`: a real Squid under a PolyMix-like load through wrk.

An nginx origin serves FILES objects of PolyMix-3 sizes; wrk sends
absolute-URI requests whose recurrence (a repeat with probability REPEAT,
else a new URL) gives a target hit ratio of about 55%, as in the papers;
a helper holds many idle keep-alive client connections, as long-RTT
clients do (Mogul: lab tests with short connections under-count them).
Phases: fill (not measured), then steady (measured). During steady, a
latency probe makes sequential requests and times hits and misses apart
(wrk's per-request latency cannot tell them apart). Hit ratio and errors
by kind come from Squid's access log; wrk's socket errors and Squid's
"running out of filedescriptors" warnings are counted too.
"""

import contextlib
import errno
import http.client
import itertools
import json
import os
import random
import re
import selectors
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from proxytune.tune.datafiles import shipped
from proxytune.core import procfs
from proxytune.core.errors import ProxytuneError
from proxytune.core.invocation import command, require_root
from proxytune.core.numbers import uint
from proxytune.proxies.nginx import NginxServer
from proxytune.proxies.squid import SquidServer

from . import polymix, proxycost, proxyruns

LUA = shipped("microbench", "lua", "polymix.lua")
STORES = ["ufs", "aufs", "rock"]
# ufs/aufs directory levels: 64 directories hold the plans' 500-6,000 objects (~100 a directory);
# Squid's default 16 x 256 made 4,096 at each start and deleted them at each exit, 3.5 s a run
LEVELS = (4, 16)
QUICK = {"files": 3000, "cache_mb": 256, "mem_mb": 8, "fill_s": 8, "steady_s": 12, "concurrency": 100, "idle": 200}
FULL = {"files": 6000, "cache_mb": 512, "mem_mb": 8, "fill_s": 30, "steady_s": 60, "concurrency": 200, "idle": 1000}
REPEAT = 0.55
HISTORY = 4000         # per wrk thread: the repeated set (2 x 4000 x ~10 KB) fits the cache, as a hot set does
HIT_CODES = ("HIT",)            # TCP_HIT, TCP_MEM_HIT, TCP_IMS_HIT, TCP_REFRESH_UNMODIFIED is a revalidated hit too


def make_docroot(root: Path, files: int, seed: int = 3) -> dict:
    """FILES objects of PolyMix-3 sizes under root/f/1..FILES."""
    rng = random.Random(seed)
    (root / "f").mkdir(parents=True)
    for d in (root.parent, root, root / "f"):        # nginx's workers run as nobody
        d.chmod(0o755)
    sizes = []
    for i in range(1, files + 1):
        size = max(1, int(polymix.size_kb(rng) * 1024))
        (root / "f" / str(i)).write_bytes(rng.randbytes(size))
        sizes.append(size)
    return {"files": files, "mean_kb": statistics.mean(sizes) / 1024, "median_kb": statistics.median(sizes) / 1024,
            "total_mb": sum(sizes) / 1048576}


def origin(root: Path) -> NginxServer:
    return NginxServer(workers=1, body=f'root {root}; rewrite ^/o/[^/]+/(.*)$ /f/$1 break; '
                                         'add_header Cache-Control "max-age=86400";')


def lua_script(dirpath: Path, origin_port: int, files: int, run: str) -> Path:
    text = (LUA.read_text().replace("ORIGIN", f"127.0.0.1:{origin_port}").replace("FILES", str(files))
            .replace("REPEAT", str(REPEAT)).replace("HISTORY", str(HISTORY)).replace("RUN", run))
    path = dirpath / f"polymix-{run}.lua"
    path.write_text(text)
    return path


def run_wrk(proxy: str, script: Path, seconds: float, connections: int, threads: int = 2) -> dict:
    import subprocess
    p = subprocess.run(["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "5s",
                        "-s", str(script), f"http://{proxy}/"], capture_output=True, text=True, timeout=seconds + 120)
    m = re.search(r"^PROXYBENCH (\{.*\})$", p.stdout, re.M)
    if not m:
        raise ProxytuneError(f"wrk printed no result: {(p.stderr or p.stdout).strip()[-300:]}")
    r = json.loads(m.group(1))
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6) if r["duration_us"] else 0.0
    r["mb_per_s"] = r["bytes"] / 1048576 / (r["duration_us"] / 1e6) if r["duration_us"] else 0.0
    return r


class IdleClients:
    """N keep-alive client connections that each fetch one object and then sit idle. They are set up
    WINDOW at a time (non-blocking; a sequential setup took seconds of each run): fewer than any listen
    backlog a proxy uses, so a proxy that defers accepts still sees its clients queue, not the kernel
    drop their SYNs. A client without its response within TIMEOUT_S has failed, counted by its error."""
    WINDOW, TIMEOUT_S = 32, 10.0

    def __init__(self, host: str, proxy_port: int, origin_port: int, n: int):
        self.host, self.proxy_port, self.origin_port, self.n = host, proxy_port, origin_port, n
        self.socks: list[socket.socket] = []
        self.failed: dict[str, int] = {}

    def _fail(self, sel, s: socket.socket, name: str) -> None:
        self.failed[name] = self.failed.get(name, 0) + 1
        sel.unregister(s)
        s.close()

    def _request(self, i: int) -> bytes:
        return (f"GET http://127.0.0.1:{self.origin_port}/o/idle-{i}/1 HTTP/1.1\r\n"
                f"Host: 127.0.0.1:{self.origin_port}\r\nConnection: keep-alive\r\n\r\n").encode()

    def _dial(self, sel, i: int) -> None:
        s = socket.socket()
        s.setblocking(False)
        err = s.connect_ex((self.host, self.proxy_port))
        sel.register(s, selectors.EVENT_WRITE, (i, time.monotonic() + self.TIMEOUT_S))
        if err not in (0, errno.EINPROGRESS):
            self._fail(sel, s, type(OSError(err, os.strerror(err))).__name__)

    def _step(self, sel, s: socket.socket, events: int) -> None:
        """One ready client: its handshake done (send the request) or its response come (hold it)."""
        i, deadline = sel.get_key(s).data
        try:
            if events & selectors.EVENT_WRITE:
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, os.strerror(err))
                s.send(self._request(i))            # ~120 bytes into an empty send buffer
                sel.modify(s, selectors.EVENT_READ, (i, deadline))
            elif not s.recv(65536):
                raise ConnectionResetError("closed")
            else:
                sel.unregister(s)
                self.socks.append(s)
        except BlockingIOError:
            pass
        except OSError as e:
            self._fail(sel, s, type(e).__name__)

    def __enter__(self):
        with selectors.DefaultSelector() as sel:
            todo = iter(range(self.n))
            for i in itertools.islice(todo, self.WINDOW):
                self._dial(sel, i)
            while sel.get_map():
                for key, events in sel.select(1.0):
                    self._step(sel, key.fileobj, events)
                now = time.monotonic()
                for key in [k for k in sel.get_map().values() if k.data[1] < now]:
                    self._fail(sel, key.fileobj, "TimeoutError")
                for i in itertools.islice(todo, self.WINDOW - len(sel.get_map())):
                    self._dial(sel, i)
        return self

    def still_open(self) -> int:
        """Clients whose connection the proxy still holds: what is left of a response is read and
        dropped first (unread bytes would hide a FIN behind them: a closed client counted as held)."""
        alive = 0
        for s in self.socks:
            s.setblocking(False)
            try:
                while s.recv(65536):
                    pass                        # ends at the FIN (closed) or at BlockingIOError (held)
            except BlockingIOError:
                alive += 1
            except OSError:
                pass
        return alive

    def __exit__(self, *exc):
        for s in self.socks:
            s.close()
        return False


def latency_probe(host: str, proxy_port: int, origin_port: int, files: int, seconds: float, out: dict) -> None:
    """Sequential requests through the proxy for `seconds`: a new URL (a miss), then the same URL again
    (a hit), timed apart and classified by Squid's X-Cache header."""
    rng = random.Random(11)
    lat = {"hit": [], "miss": []}
    errors = 0
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        url = f"http://127.0.0.1:{origin_port}/o/probe-{i}/{rng.randint(1, files)}"
        i += 1
        for _ in range(2):
            c = http.client.HTTPConnection(host, proxy_port, timeout=10)
            try:
                t0 = time.perf_counter()
                c.request("GET", url)
                resp = c.getresponse()
                resp.read()
                dt = (time.perf_counter() - t0) * 1e6
                if resp.status == 200:
                    lat["hit" if "HIT" in (resp.getheader("X-Cache") or "") else "miss"].append(dt)
                else:
                    errors += 1
            except (OSError, http.client.HTTPException):     # a proxy cutting a body short is an error, not a crash
                errors += 1
            finally:
                c.close()
    out.update({kind: _pct(v) for kind, v in lat.items()})
    out["errors"] = errors


def _pct(v: list[float]) -> dict | None:
    if not v:
        return None
    v = sorted(v)
    q = lambda p: v[min(len(v) - 1, int(p * len(v)))]
    return {"n": len(v), "p50": round(q(0.5), 1), "p90": round(q(0.9), 1), "p99": round(q(0.99), 1),
            "max": round(v[-1], 1), "mean": round(sum(v) / len(v), 2)}


def access_log(text: str) -> dict:
    """Squid native log lines -> requests, hits, byte hits, result codes and Squid's own service
    time (its elapsed field: from reading a request to the reply's end, whole ms, percentiles)."""
    codes: dict[str, int] = {}
    n = hits = 0
    bytes_all = bytes_hit = 0
    elapsed = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 7 or "/" not in f[3]:
            continue
        if "/idle-" in f[6] or "/probe-" in f[6]:
            continue
        n += 1
        ms = uint(f[1])             # the native format's elapsed: ms from reading the request to the reply's end
        if ms is not None:
            elapsed.append(float(ms))
        code = f[3]
        codes[code] = codes.get(code, 0) + 1
        size = uint(f[4]) or 0
        bytes_all += size
        if any(h in code.split("/")[0] for h in HIT_CODES):
            hits += 1
            bytes_hit += size
    return {"requests": n, "hit_ratio": hits / n if n else None, "service_ms": _pct(elapsed),
            "byte_hit_ratio": bytes_hit / bytes_all if bytes_all else None,
            "codes": dict(sorted(codes.items(), key=lambda kv: -kv[1])),
            "errors": {c: k for c, k in codes.items() if not c.endswith("/200") and not c.endswith("/304")}}


def fd_warnings(cache_log: str) -> int:
    return len(re.findall(r"running out of filedescriptors|Too many open files|accept failure"
                          r"|Reserved FD adjusted|serious shortage of filedescriptors", cache_log))


class FdPeak:
    """The most descriptors a process held, sampled from /proc/PID/fd every 10 ms while in the block.
    Squid writes to cache.log only when an accept is deferred (below RESERVED_FD free, once per 15 s);
    it refuses keep-alive and closes idle server connections earlier, silently: the peak shows both."""

    def __init__(self, pid: int, every_s: float = 0.01):
        self.pid, self.every_s, self.peak = pid, every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, procfs.fd_count(self.pid) or 0)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False


def squid_fd_pressure(limit: int, peak: int) -> str:
    """Squid's own zones for descriptors in use (src/fd.cc fdUsageHigh, src/comm/TcpAcceptor.cc
    okToAccept; RESERVED_FD is min(100, max_fd / 4)): below RESERVED_FD free it defers accepts; below
    twice that, or a quarter of those in use, it stops client keep-alive and server pconns."""
    reserved = min(100, limit // 4)
    free = limit - peak
    if free < reserved:
        return "accepts deferred"
    if free < 2 * reserved or free < peak // 4:
        return "keep-alive refused"
    return "none"


def _drive(host: str, port: int, plan: dict, origin_port: int, workdir: Path, tag: str, progress=None,
           cost_pid: int | None = None, on_steady=None, around_steady=contextlib.nullcontext) -> dict:
    """Fill, then steady with idle clients and the latency probe, against a proxy at host:port.
    With cost_pid (a proxy we started), syscalls and device writes of its processes during steady;
    around_steady(): a context held while wrk's steady load runs (the doctor watching)."""
    n = len(list(workdir.glob("polymix-*.lua")))
    run = re.sub(r"[^\w]+", "-", tag)          # it goes into URLs and file names
    fill_script = lua_script(workdir, origin_port, plan["files"], f"{run}-{n}-f")
    script = lua_script(workdir, origin_port, plan["files"], f"{run}-{n}-s")
    if progress:
        progress(f"{tag}: fill")
    fill = run_wrk(f"{host}:{port}", fill_script, plan["fill_s"], plan["concurrency"])
    if progress:
        progress(f"{tag}: idle clients")
    # "steady" (the proxy's logs and counters marked) once the idle clients are held: their one miss
    # each is not the mix; around_steady() then, before the probe, the cost counters and wrk start: a
    # watch that takes seconds to attach (the doctor's compile) delays them all alike
    with IdleClients(host, port, origin_port, plan["idle"]) as idle, _steady(progress, tag, on_steady), \
            around_steady(), (proxycost.Cost(cost_pid) if cost_pid else contextlib.nullcontext()) as cost:
        probe: dict = {}
        t = threading.Thread(target=latency_probe, args=(host, port, origin_port, plan["files"],
                                                         plan["steady_s"] - 1, probe), daemon=True)
        t.start()
        steady = run_wrk(f"{host}:{port}", script, plan["steady_s"], plan["concurrency"])
        t.join()
        idle_open = idle.still_open()
        idle_failed = dict(idle.failed)
    dropped = plan["idle"] - sum(idle_failed.values()) - idle_open
    served = steady["requests"] + sum((probe.get(k) or {}).get("n", 0) for k in ("hit", "miss")) + len(idle.socks)
    return {"fill": _brief(fill), "steady": _brief(steady), "latency_probe": probe,
            "idle_failed": idle_failed, "idle_dropped": dropped,
            "error_count": _error_count(steady, idle_failed, dropped),
            "cost": cost.result(served) if cost else None}


@contextlib.contextmanager
def _steady(progress, tag: str, on_steady):
    """The steady phase begins: said to the progress callback (run_store marks the access log there)
    and to on_steady (run_proxy reads its counters there)."""
    if progress:
        progress(f"{tag}: steady")
    if on_steady:
        on_steady()
    yield


def _errors(d: dict, squid_codes: dict | None, warnings: int | None) -> dict:
    return {"wrk_socket": d["steady"]["errors"], "http_status": d["steady"]["http_errors"],
            "squid_codes": squid_codes or {}, "idle_clients_failed": d["idle_failed"],
            "idle_clients_dropped": d["idle_dropped"], "fd_warnings_in_cache_log": warnings or 0}


def run_store(store: str, plan: dict, origin_port: int, workdir: Path, nofile: tuple[int, int] | None = None,
              progress=None, watch=None, cpus: str | None = None) -> dict:
    """One Squid with this store, started here; hit ratio and errors from its own logs. With a watch
    (probes.selfload.PerfWatch, given by the report), perf watches Squid through the steady load: its
    CPU split goes in "watched"."""
    with SquidServer(store, cache_mb=plan["cache_mb"], mem_mb=plan["mem_mb"], nofile=nofile, cpus=cpus,
                     levels=LEVELS) as sq:
        limits = _nofile_of(sq.pid)
        affinity = sorted(os.sched_getaffinity(sq.pid)) if cpus else None
        mark = [0]

        def step(desc):
            if "steady" in desc:
                mark[0] = len(sq.log("access.log"))
            if progress:
                progress(desc)
        box: dict = {}
        around = (lambda: watch.around(sq.pid, box)) if watch else contextlib.nullcontext
        with FdPeak(sq.pid) as fds:
            d = _drive("127.0.0.1", sq.port, plan, origin_port, workdir, f"squid {store}", step, cost_pid=sq.pid,
                       around_steady=around)
        log = access_log(sq.log("access.log")[mark[0]:])
        warnings = fd_warnings(sq.log("cache.log"))
    fd = {"peak": fds.peak, "pressure": squid_fd_pressure(limits[0], fds.peak) if limits and isinstance(limits[0], int) else None}
    return {"proxy": "squid", "store": store, "nofile": limits, "fd": fd, "fill": d["fill"], "steady": d["steady"],
            **({"cpus": affinity} if affinity else {}),
            "hit_ratio": log["hit_ratio"], "hit_ratio_from": "squid access.log", "byte_hit_ratio": log["byte_hit_ratio"],
            "service_ms": log["service_ms"],
            "codes": log["codes"], "errors": _errors(d, log["errors"], warnings), "error_count": d["error_count"],
            "latency_probe": d["latency_probe"], "cost": d["cost"],
            **({"watched": watch.view(box, f"squid ({store}, started by the report, under the mix)")}
               if watch else {})}


def run_target(target: str, plan: dict, origin_port: int, workdir: Path, progress=None) -> dict:
    """A proxy the user runs (it must reach our origin on 127.0.0.1): its logs are not ours, so the
    hit ratio comes from X-Cache headers (Squid and Varnish-style proxies send them), else None."""
    host, _, port = target.rpartition(":")
    d = _drive(host or "127.0.0.1", int(port), plan, origin_port, workdir, f"target {target}", progress)
    st = d["steady"]
    seen = st["x_cache_hits"] + st["x_cache_misses"]
    return {"proxy": "target", "store": f"target {target}", "nofile": None, "fill": d["fill"], "steady": st,
            "hit_ratio": st["x_cache_hits"] / seen if seen and st["x_cache_hits"] else None,
            "byte_hit_ratio": None, "codes": {}, "errors": _errors(d, None, None), "error_count": d["error_count"],
            "latency_probe": d["latency_probe"]}


def _brief(w: dict) -> dict:
    return {k: w[k] for k in ("requests", "rps", "mb_per_s", "latency_us", "errors", "x_cache_hits",
                              "x_cache_misses", "http_errors")}


def _error_count(steady: dict, idle_failed: dict, idle_dropped: int) -> int:
    """Failed client requests: socket errors and HTTP errors seen by wrk (its 'status' count is the
    same as the HTTP errors), plus idle clients refused or dropped."""
    sock = sum(v for k, v in steady["errors"].items() if k != "status")
    return sock + steady["http_errors"] + sum(idle_failed.values()) + max(idle_dropped, 0)


def _nofile_of(pid: int) -> list:
    lim = procfs.nofile_limits(pid)
    return list(lim) if lim else None


def run(quick: bool = False, stores: list[str] | None = None, concurrency: int | None = None,
        idle: int | None = None, nofile: tuple[int, int] | None = None, quiet: bool = False,
        target: str | None = None, proxies: list[str] | None = None) -> dict:
    """Every (proxy, store) asked for, one after the other, behind one origin and docroot: each proxy
    runs the given stores that are its own, or all of its stores (proxyruns.runs_for)."""
    return run_plan(_plan_for(quick, concurrency, idle), stores, nofile, quiet, target, proxies, quick=quick)


@contextlib.contextmanager
def _bed(plan: dict, quiet: bool, total: int, result: dict):
    """What every series of proxy runs stands on: a private directory, the docroot (recorded in
    `result`), its nginx origin and one progress bar; yields (directory, origin, bar, task)."""
    from .runner import progress as progress_bar
    with tempfile.TemporaryDirectory(prefix="proxytune-proxybench-") as d, progress_bar(quiet) as bar:
        task = bar.add_task("bench proxy", total=total)
        root = Path(d)
        result["docroot"] = make_docroot(root / "doc", plan["files"])
        with origin(root / "doc") as og:
            yield root, og, bar, task


def run_plan(plan: dict, stores: list[str] | None = None, nofile: tuple[int, int] | None = None, quiet: bool = False,
             target: str | None = None, proxies: list[str] | None = None, quick: bool = True,
             watch=None) -> dict:
    """run() with its plan given; with a watch (run_store), each Squid's steady load is watched."""
    runs = [] if target else proxyruns.runs_for(proxies or ["squid"], stores)
    result = {"bench": "proxy", "quick": quick, "plan": plan, "repeat": REPEAT, "stores": []}
    with _bed(plan, quiet, 2 * max(len(runs), 1), result) as (root, og, bar, task):
        def step(desc):
            bar.update(task, description=desc)
        if target:
            result["target"] = target
            result["stores"].append(run_target(target, plan, og.port, root, progress=step))
        for proxy, store in runs:
            if proxy == "squid":
                result["stores"].append(run_store(store, plan, og.port, root, nofile, progress=step, watch=watch))
            else:
                result["stores"].append(run_proxy(proxy, store, plan, og.port, root, nofile, step))
            bar.update(task, completed=2 * len(result["stores"]))
    watched = [s.pop("watched") for s in result["stores"] if "watched" in s]
    if watched:
        result["watched"] = watched[-1]
    return result


def run_proxy(proxy: str, store: str, plan: dict, origin_port: int, workdir, nofile=None, progress=None) -> dict:
    """One proxy other than Squid with one store under the plan's load; hits from its own counters."""
    with proxyruns.start(proxy, store, plan, origin_port, nofile) as s:
        limits = _nofile_of(s.pid)
        mark: dict = {}
        d = _drive("127.0.0.1", s.port, plan, origin_port, workdir, f"{proxy} {store}", progress, cost_pid=s.pid,
                   on_steady=lambda: mark.update(c=proxyruns.counters(proxy, s), f=proxyruns.failures(proxy, s)))
        after, failed = proxyruns.counters(proxy, s), proxyruns.failures(proxy, s)
    st = d["steady"]
    if after is not None:
        hits, misses = after["hits"] - mark["c"]["hits"], after["misses"] - mark["c"]["misses"]
        source = proxyruns.hit_ratio_from(proxy)
    else:
        hits, misses, source = st["x_cache_hits"], st["x_cache_misses"], "X-Cache headers seen by wrk"
    return {"proxy": proxy, "store": store, "nofile": limits, "fill": d["fill"], "steady": st,
            "hit_ratio": hits / (hits + misses) if hits + misses else None, "hit_ratio_from": source,
            "byte_hit_ratio": None, "codes": {}, "errors": _errors(d, None, None),
            "error_count": d["error_count"], "latency_probe": d["latency_probe"], "cost": d["cost"],
            "proxy_failures": {k: v - mark["f"][k] for k, v in failed.items()} if failed else None}


def _plan_for(quick: bool, concurrency: int | None, idle: int | None) -> dict:
    plan = dict(QUICK if quick else FULL)
    if concurrency:
        plan["concurrency"] = concurrency
    if idle is not None:
        plan["idle"] = idle
    return plan


DEFAULT_SERVICE_NOFILE = 1024       # systemd's soft RLIMIT_NOFILE default (systemd-system.conf(5))


def service_nofile(changes, service: str) -> tuple[int, int]:
    """(as it is, as the profile wants it) for the service's LimitNOFILE; a service that sets none
    (Debian's squid.service) gets systemd's soft default."""
    c = next((c for c in changes if c.setting.address == f"service:{service}:LimitNOFILE"), None)
    now = uint(str(c.current)) if c is not None and isinstance(c.current, (int, str)) else None
    now = DEFAULT_SERVICE_NOFILE if now is None else now
    want = uint(str(c.setting.wanted)) if c is not None else None
    return now, max(now, want or now)


TARGET = re.compile(r"[\w.\-]+:\d{1,5}")


def refuse_bad_request(target: str | None, compare_profile: str | None, stores, proxies, yes: bool) -> None:
    """Refuse a `bench proxy` that cannot run as asked, before anything starts: --target is HOST:PORT
    and loads the user's proxy (so none of ours: no --proxy, --store, --compare-profile); starting
    ours needs root; --compare-profile changes the host (--yes) around one proxy."""
    if target:
        if not TARGET.fullmatch(target) or not 0 < int(target.rsplit(":", 1)[1]) < 65536:
            raise ProxytuneError(f"--target must be HOST:PORT, not {target!r}", "e.g. --target 127.0.0.1:3128")
        if compare_profile or stores or proxies:
            raise ProxytuneError("--target loads your proxy; --proxy, --store and --compare-profile start our own")
    else:
        require_root("it starts squid, which drops privileges to user proxy")
    if compare_profile:
        if not yes:
            raise ProxytuneError("--compare-profile changes the host (journaled, rolled back after)",
                                 f"add --yes; {command('tune plan --profile ...')} shows the changes")
        if len(proxies) > 1 or "all" in proxies:
            raise ProxytuneError("--compare-profile runs one proxy before and after", "give one --proxy")


def compare_profile(host, profile_ref: str, store: str | None = "ufs", quick: bool = False, concurrency: int | None = None,
                    idle: int | None = None, only: tuple = (), skip: tuple = (), quiet: bool = False,
                    proxy: str = "squid") -> dict:
    """The same load on the host as it is, then with the profile applied (journaled), then rolled back.

    The proxy (Squid unless told) is started the way its service would be: with the service's LimitNOFILE (Debian's
    squid.service sets none, so systemd's soft default of 1024) before, and the profile's after,
    both capped by this process's hard limit (raising it needs CAP_SYS_RESOURCE)."""
    import resource
    from proxytune.tune import apply as apply_mod, plan as plan_mod
    from proxytune.tune.apply import describe
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    service = proxyruns.SERVICES[proxy]
    params = {"service": service}
    plan = plan_mod.build(profile_ref, host, params, only, skip)
    apply_mod.refuse_blocked(plan)

    limit_before = service_nofile(plan.changes, service)[0]
    load = (concurrency or (400 if quick else 600), idle if idle is not None else 1000)
    stores = [store or proxyruns.STORES[proxy][0]]
    before = run(quick, stores, *load, (min(limit_before, hard), hard), quiet, proxies=[proxy])
    outcome = apply_mod.apply_plan(plan, host, persist=False)
    try:
        applied = plan_mod.build(profile_ref, host, params, only, skip)
        limit_after = service_nofile(applied.changes, service)[0]
        after = run(quick, stores, *load, (min(limit_after, hard), hard), quiet, proxies=[proxy])
    finally:
        undone = apply_mod.rollback(host, outcome.entry["id"]) if outcome.entry else None
    return {"bench": "proxy", "quick": quick, "compare_profile": profile_ref, "proxy": proxy,
            "store": before["stores"][0]["store"],
            "plan": before["plan"], "repeat": REPEAT, "docroot": before["docroot"],
            "service_nofile": {"before": limit_before, "after": limit_after, "hard_limit_here": hard,
                               "capped": limit_after > hard},
            "applied": [describe(st) for st in outcome.steps],
            "rolled_back": bool(undone) and not undone.failures,
            "stores": before["stores"] + after["stores"],
            "before": before["stores"][0], "after": after["stores"][0]}

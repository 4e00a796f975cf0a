"""The own-cap diagnosis matrix: which proxy, which cap, which load shape,
what the doctor must say. A cell starts its proxy and its load once, then
the doctor looks three times in a row; every look is judged, so a rule that
holds by chance fails. The cells and their expected verdict are data here,
shared by the live test (test_matrix_owncap.py) and the replay of recorded
evidence (test_matrix_replay.py), which needs neither root nor proxies.

Shapes: idle (keep-alive clients that sent one request and hold their
connection, more of them than the cap, plus light wrk), busy (wrk with
connections well above the cap; for squid on top of held keep-alive clients), slow (reverse proxy in front of an origin
that answers after SLOW_S, nothing cached), healthy (paced load far below
every cap: no finding of severity high or medium), cpu (the proxy's loop at
a full core on work of its own: its hotspot is the finding).

A cell with `perf` runs the doctor with CPU sampling (the others pass
--no-perf): the hotspot rule is judged there, on a busy healthy proxy whose
loop is far from a full core (no finding) and on one whose loop is at it.
A HAProxy cell without maxconn starts haproxy with -V, which prints the
maxconn it derived from its fd limit: the figure the doctor must find.
"""

import json
import os
import re
import selectors
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

OWN = {"haproxy": "haproxy-maxconn", "nginx": "nginx-worker-connections", "varnish": "varnish-thread-pool",
       "squid": "squid-fd-limit", "trafficserver": "trafficserver-connections-throttle"}
DIRECTIVE = {"haproxy": "maxconn", "nginx": "worker_connections", "varnish": "thread_pool_max",
             "squid": "max_filedescriptors", "trafficserver": "connections_throttle"}
BINARY = {"haproxy": "/usr/sbin/haproxy", "nginx": "/usr/sbin/nginx", "varnish": "/usr/sbin/varnishd",
          "squid": "/usr/sbin/squid", "trafficserver": "/usr/bin/traffic_server"}
FORWARD = ("squid", "trafficserver")      # forward proxies: idle/busy/healthy requests carry absolute URLs
SLOW_S = 0.3                              # the slow origin's time per response
WINDOW = "3"                              # seconds per doctor look
RUNS = 3
ADVISES_SOMAXCONN = re.compile(r"\b(raise|set|increase|tune)\b(?:(?!\.\s|;).)*somaxconn")   # within one clause
EVIDENCE = Path(__file__).resolve().parent / "evidence" / "owncap"
CPU_IDS = ("cpu-hotspot", "cpu-bound")      # a loop at a full core on its own work: either names it
DERIVED_FIX = "set maxconn and the fd limit together"
HOT_RULE_MIN_CPU, HOT_RULE_MIN_SHARE = 0.2, 0.10   # where the old cpu-hotspot rule fired (issue 28)


@dataclass(frozen=True)
class Cell:
    name: str
    proxy: str
    shape: str                    # idle | busy | slow | healthy
    cap: str                      # the cap as configured, in the proxy's words
    cap_value: int                # the number the load is sized against (connections, threads or fds)
    stats: bool                   # the proxy's own stats interface is on
    opts: dict = field(default_factory=dict)    # keyword arguments of the server class
    idle: int = 0                 # held keep-alive clients
    wrk: int = 0                  # wrk connections
    issue: str = ""               # the reported misdiagnosis this cell reproduces
    perf: bool = False            # the doctor samples CPU (perf); else --no-perf
    delay_ms: int = 100           # a healthy cell's pause per request and wrk connection (paced load)
    fix_says: str = ""            # words the own cap's fix must hold

    @property
    def expect(self) -> str:
        if self.shape == "healthy":
            return "no high/medium finding" + ("; no cpu-hotspot, its top functions in headroom" if self.perf else "")
        if self.shape == "cpu":
            return " or ".join(CPU_IDS) + " first, or proxy-cpu citing one"
        return f"{OWN[self.proxy]} first"

    @property
    def derived(self) -> bool:
        """HAProxy without maxconn: it derives its cap from its fd limit."""
        return self.proxy == "haproxy" and self.opts.get("maxconn", 1) is None


def _cells() -> list[Cell]:
    c = Cell
    return [
        # HAProxy: global maxconn with and without the stats socket, and a frontend's own maxconn
        c("haproxy-idle-global200-nostats", "haproxy", "idle", "global maxconn 200", 200, False,
          {"maxconn": 200, "stats_socket": False}, idle=1500, wrk=50,
          issue="haproxy 2.6, maxconn 200, no stats socket, 1,500 idle keep-alive clients + wrk -c50: "
                "reported as accept-queue-overflow / somaxconn"),
        c("haproxy-busy-global50-stats", "haproxy", "busy", "global maxconn 50", 50, True,
          {"maxconn": 50}, wrk=200),
        c("haproxy-slow-frontend100-stats", "haproxy", "slow", "frontend maxconn 100 (global 4096)", 100, True,
          {"maxconn": 4096, "frontend_maxconn": 100}, wrk=300),
        c("haproxy-healthy", "haproxy", "healthy", "global maxconn 4096", 4096, True, {"maxconn": 4096}, wrk=4),
        # HAProxy without maxconn: derived from the fd limit (read back from its listener's backlog, or computed
        # as HAProxy 2.6 does when a `backlog` hides it), the limit haproxy -V printed is the cap_value
        c("haproxy-idle-derived-fd256-nostats", "haproxy", "idle", "maxconn not set, fd limit 256 (derived)", 0,
          False, {"maxconn": None, "stats_socket": False, "nofile": (256, 256), "verbose": True}, idle=400, wrk=10,
          fix_says=DERIVED_FIX,
          issue="haproxy 2.6 without maxconn under a 256-fd limit, idle keep-alive clients (fds near half the "
                "limit, accepting stopped): ranked accept-queue-overflow first with `backlog 8192`"),
        c("haproxy-busy-derived-fd128of512-backlog64-nostats", "haproxy", "busy",
          "maxconn not set, fd limit soft 128 / hard 512, bind backlog 64 (derived)", 0, False,
          {"maxconn": None, "stats_socket": False, "nofile": (128, 512), "bind": "backlog 64", "verbose": True},
          wrk=400, fix_says=DERIVED_FIX),
        # nginx (as a reverse proxy: a proxied request holds two connections): 64/128, 1/2 workers, an include
        c("nginx-idle-wc64x1-status", "nginx", "idle", "worker_connections 64, 1 worker", 64, True,
          {"connections": 64, "workers": 1, "stub_status": True}, idle=300, wrk=10),
        c("nginx-busy-wc128x1-nostatus", "nginx", "busy", "worker_connections 128, 1 worker", 128, False,
          {"connections": 128, "workers": 1}, wrk=400,
          issue="nginx reverse proxy at worker_connections 128 under 400 connections: own cap not named first"),
        c("nginx-busy-wc64x2-include", "nginx", "busy", "worker_connections 64 (include), 2 workers", 128, False,
          {"connections": 64, "workers": 2, "events_include": True}, wrk=400),
        c("nginx-slow-wc128x2-status", "nginx", "slow", "worker_connections 128, 2 workers", 256, True,
          {"connections": 128, "workers": 2, "stub_status": True}, wrk=600),
        c("nginx-healthy", "nginx", "healthy", "worker_connections 4096", 4096, True,
          {"connections": 4096, "workers": 1, "stub_status": True}, wrk=4),
        # cpu-hotspot: a paced reverse proxy at a few thousand requests/s (no loop near a full core: no
        # finding), and a loop at a full core compressing with gzip level 9 (the hotspot is the finding)
        c("nginx-healthy-paced2w-perf", "nginx", "healthy", "worker_connections 4096, 2 workers", 8192, True,
          {"connections": 4096, "workers": 2, "stub_status": True}, wrk=40, delay_ms=10, perf=True,
          issue="healthy nginx reverse proxy, 2 workers, a few thousand requests/s: cpu-hotspot at medium (the "
                "rule fired at 0.2 cores with any function at 10 % of samples)"),
        c("nginx-cpu-gzip9x1-perf", "nginx", "cpu", "worker_connections 4096, 1 worker, gzip_comp_level 9", 4096,
          True, {"connections": 4096, "workers": 1, "stub_status": True, "gzip": True}, wrk=8, perf=True),
        # Varnish (varnishstat always there): thread_pool_max and the number of pools
        c("varnish-idle-max10x1", "varnish", "idle", "thread_pool_max 10, 1 pool", 10, True,
          {"params": {"thread_pool_min": 5, "thread_pool_max": 10, "thread_pools": 1}}, idle=1000, wrk=20),
        c("varnish-busy-max10x2", "varnish", "busy", "thread_pool_max 10, 2 pools", 20, True,
          {"params": {"thread_pool_min": 5, "thread_pool_max": 10, "thread_pools": 2}}, wrk=300),
        c("varnish-slow-max20x1", "varnish", "slow", "thread_pool_max 20, 1 pool", 20, True,
          {"params": {"thread_pool_min": 5, "thread_pool_max": 20, "thread_pools": 1}}, wrk=100),
        c("varnish-healthy", "varnish", "healthy", "thread_pool_max 5000 (default)", 10000, True, {}, wrk=4),
        # Squid: max_filedescriptors 256/512, cache manager allowed or denied; reverse (accel) in front of slow
        c("squid-idle-fd256-mgr", "squid", "idle", "max_filedescriptors 256", 256, True,
          {"max_filedescriptors": 256}, idle=400, wrk=10),
        # busy squid: wrk alone cannot hold its fds, since above cap - 2 x RESERVED_FD in use fdUsageHigh()
        # turns client keep-alive off (src/client_side_reply.cc "Not many unused FDs, can't keep-alive") and
        # wrk's connections are closed after each answer; a busy forward proxy's browsers also hold
        # keep-alive connections: 400 held clients (above that point) stay, and wrk -c800 runs on top
        c("squid-busy-fd512-nomgr", "squid", "busy", "max_filedescriptors 512", 512, False,
          {"max_filedescriptors": 512, "manager": False}, idle=400, wrk=800),
        c("squid-slow-fd256-nomgr", "squid", "slow", "max_filedescriptors 256 (accel)", 256, False,
          {"max_filedescriptors": 256, "manager": False}, wrk=300),
        c("squid-healthy", "squid", "healthy", "max_filedescriptors 8192", 8192, True,
          {"max_filedescriptors": 8192}, wrk=4),
        # Traffic Server: connections_throttle 50/100, stats_over_http on or off; remap in front of slow
        c("trafficserver-idle-t100-stats", "trafficserver", "idle", "connections_throttle 100", 100, True,
          {"throttle": 100}, idle=400, wrk=10),
        c("trafficserver-busy-t50-nostats", "trafficserver", "busy", "connections_throttle 50", 50, False,
          {"throttle": 50, "stats_plugin": False}, wrk=200),
        c("trafficserver-slow-t100-nostats", "trafficserver", "slow", "connections_throttle 100 (remap)", 100, False,
          {"throttle": 100, "stats_plugin": False}, wrk=300),
        c("trafficserver-healthy", "trafficserver", "healthy", "connections_throttle 10000", 10000, True,
          {"throttle": 10000}, wrk=4),
    ]


CELLS = _cells()
BY_NAME = {c.name: c for c in CELLS}


# ---------------------------------------------------------------- the expected verdict, on one doctor JSON

def verdict_problems(cell: Cell, doc: dict, where: str) -> list[str]:
    """What is wrong with one doctor answer for this cell (empty: the verdict holds)."""
    found = doc["findings"]
    ids = [f["id"] for f in found]
    if cell.shape == "healthy":
        loud = [f"{f['id']} ({f['severity']})" for f in found if f["severity"] in ("high", "medium")]
        return ([f"healthy proxy, yet: {', '.join(loud)}"] if loud else []) + (cpu_info_problems(doc, ids)
                                                                               if cell.perf else [])
    if cell.shape == "cpu":
        return cpu_first_problems(found, ids)
    out = []
    if not ids or ids[0] != OWN[cell.proxy]:
        out.append(f"first finding {ids[:1] or 'none'}, expected {OWN[cell.proxy]} (all: {ids})")
    else:
        own = found[0]
        text = own["fix"] + " " + json.dumps(own["evidence"], default=str)
        if DIRECTIVE[cell.proxy] not in own["fix"]:
            out.append(f"fix does not name {DIRECTIVE[cell.proxy]}: {own['fix'][:200]}")
        if where not in text:
            out.append(f"neither fix nor evidence names {where}")
        if cell.fix_says and cell.fix_says not in own["fix"]:
            out.append(f"fix does not say {cell.fix_says!r}: {own['fix'][:200]}")
        said = (doc.get("matrix") or {}).get("haproxy_maxconn")
        if cell.derived and said is not None and own["evidence"].get("limit") != said:
            out.append(f"maxconn read as {own['evidence'].get('limit')}, haproxy -V says it derived {said}")
    # the own cap's fix may say why somaxconn does not help; no fix may tell to raise it
    out += [f"{f['id']} tells to tune somaxconn" for f in found
            if "somaxconn" in (f.get("fix") or "") and (f is not found[0] or ids[0] != OWN[cell.proxy]
                                                         or ADVISES_SOMAXCONN.search(f["fix"]))]
    return out


def cpu_first_problems(found: list[dict], ids: list[str]) -> list[str]:
    """A loop at a full core on its own work: the first finding names it, either as the CPU finding itself or
    as the budget's proxy-cpu (where the request's time goes: the proxy itself) citing that finding as its
    cause and carrying its fix (probes/budget_findings.py proxy_cpu); the cause is then among the findings."""
    if ids and ids[0] in CPU_IDS:
        return []
    if ids and ids[0] == "proxy-cpu":
        cause = (found[0]["evidence"].get("cause") or {}).get("finding")
        if cause in CPU_IDS and cause in ids:
            return []
        return [f"proxy-cpu first without a CPU finding as its cause (cause {cause}, all: {ids})"]
    return [f"first finding {ids[:1] or 'none'}, expected one of {CPU_IDS} or proxy-cpu citing one (all: {ids})"]


def cpu_info_problems(doc: dict, ids: list[str]) -> list[str]:
    """A busy proxy whose loop is far from a full core: no cpu-hotspot at any severity, and its top
    functions shown in headroom as information."""
    out = ["cpu-hotspot raised"] if "cpu-hotspot" in ids else []
    rows = [r for r in doc["data"].get("headroom") or [] if r.get("top_functions")]
    return out + ([] if rows else ["no top functions in headroom"])


def expected_where(cell: Cell, conf: Path | None) -> str:
    """Where the cap is set: `file:line` of the directive in the generated config (the events block's
    own file for an include), varnishd's command line (-p), or the config without it (derived)."""
    if cell.proxy == "varnish":
        return "command line"
    if cell.derived:
        return f"{conf} (not set)"
    text = conf.read_text().splitlines()
    value = {"trafficserver": r"INT\s+%d"}.get(cell.proxy, r"%d") % cell.opts.get(
        {"haproxy": "frontend_maxconn" if "frontend_maxconn" in cell.opts else "maxconn", "nginx": "connections",
         "squid": "max_filedescriptors", "trafficserver": "throttle"}[cell.proxy])
    for n, line in enumerate(text, 1):
        if re.search(rf"{DIRECTIVE[cell.proxy]}\s+{value}\b", line):
            return f"{conf}:{n}"
    raise AssertionError(f"{DIRECTIVE[cell.proxy]} not in {conf}")


# ---------------------------------------------------------------- did the load produce the condition?

def pressure(doc: dict) -> dict:
    """The raw measures of load against the cap in one answer's evidence (not the rules' reading)."""
    ev = doc["data"]["evidence"]
    p = ev.get("proxy") or {}
    a, b = p.get("stats_before") or {}, p.get("stats_after") or {}

    def delta(k):
        return (b[k] - a[k]) if isinstance(a.get(k), int) and isinstance(b.get(k), int) else None
    return {"accept_queue": sum(l["queued"] for l in ev.get("listeners", [])),
            "clients": (ev.get("connections") or {}).get("clients"),
            "connections": (ev.get("connections") or {}).get("total"),
            "max_proc_fds": max((pr.get("fds_open") or 0 for pr in ev.get("procs", {}).values()), default=0),
            "proc_fds": {pid: pr.get("fds_open") for pid, pr in ev.get("procs", {}).items()},
            "accepts_per_s": (ev.get("loop") or {}).get("accepts_per_s"),
            "listen_overflows": (ev.get("netstat") or {}).get("ListenOverflows"),
            # varnish's worker threads add their counters to the shared ones only when idle: under
            # saturation the deltas can read 0, its gauges (threads, thread_queue_len) do not
            "varnish": {**{k: delta(k) for k in ("MAIN.threads_limited", "MAIN.sess_queued", "MAIN.sess_dropped",
                                                 "MAIN.client_req")},
                        "threads": b.get("MAIN.threads"), "thread_queue_len": b.get("MAIN.thread_queue_len")}
            if p.get("kind") == "varnish" else None,
            # nginx: the busiest worker's peak sockets, as the rule counts them (proxies/nginx.py sockets_peak)
            "worker_sockets_peak": max((max(v.get("sockets_peak", 0), v.get("sockets_peak_fine", 0))
                                        for v in ((ev.get("conns") or {}).get("pids") or {}).values()), default=0),
            "stats": b.get("available"),
            "idle_closed_in_window": (doc.get("matrix") or {}).get("idle_closed_in_window", 0),
            "cpu_cores": round(ev.get("cpu_cores") or 0, 3),
            # the old cpu-hotspot rule's reading: a leaf or an own function (with its direct calls) at its share
            "top_share": max((t.get("share", 0) for key in ("top", "own_top")
                              for t in (ev.get("perf") or {}).get(key) or []), default=None),
            "requests_per_s": (doc.get("matrix") or {}).get("requests_per_s"),
            "haproxy_maxconn": (doc.get("matrix") or {}).get("haproxy_maxconn")}


def holds_cap(cell: Cell, p: dict) -> bool:
    """The proxy is at its cap by its own count or the kernel's, each as the proxy counts it (not the
    accept queue alone: that fills for any slow acceptor)."""
    if cell.proxy == "haproxy":                # connections it accepted and holds (stopped accepting there)
        cap = cell.cap_value or p.get("haproxy_maxconn")     # derived: what haproxy -V said it derived
        return bool(cap) and (p["clients"] or 0) >= 0.95 * cap
    if cell.proxy == "varnish":                # every thread running, or sessions waiting for one
        v = p["varnish"]
        return (v["threads"] or 0) >= cell.cap_value or (v["thread_queue_len"] or 0) > 0 or any(
            (v[k] or 0) > 0 for k in ("MAIN.threads_limited", "MAIN.sess_queued", "MAIN.sess_dropped"))
    if cell.proxy == "nginx":                  # the busiest worker's sampled peak of sockets (its connections)
        # reached the lower edge of the drain sawtooth: nginx 1.22 src/core/ngx_connection.c
        # ngx_drain_connections runs once no more than n/16 are free and closes max(1, min(32, reusable/8)),
        # so a worker at its cap oscillates between n - n/16 and about n - n/16 - min(32, n/8); the fd count
        # at the window's end can fall anywhere in (or below) that tooth
        n = cell.opts["connections"]
        return p["worker_sockets_peak"] >= n - n // 16 - min(32, n // 8)
    if cell.proxy == "squid":                  # fdUsageHigh(): fewer than 2 x RESERVED_FD free defers accepts
        return p["max_proc_fds"] >= cell.cap_value - 2 * min(100, cell.cap_value // 4) - 5
    return (p["connections"] or 0) >= 0.9 * cell.cap_value    # ATS throttles client + origin connections


def condition_problems(cell: Cell, doc: dict) -> list[str]:
    p = pressure(doc)
    if cell.shape == "cpu":                    # one worker: the process's CPU is its loop's
        return [] if p["cpu_cores"] >= 0.8 else [f"harness: the worker did not reach a full core: {p}"]
    if cell.shape == "healthy" and cell.perf and not (
            p["cpu_cores"] >= HOT_RULE_MIN_CPU and (p["top_share"] or 0) >= HOT_RULE_MIN_SHARE
            and (p["requests_per_s"] or 0) >= 1000):
        return [f"harness: not the busy healthy proxy the old rule misread (>= {HOT_RULE_MIN_CPU} cores, a "
                f"function at >= {HOT_RULE_MIN_SHARE:.0%}, >= 1000 requests/s): {p}"]
    if cell.shape == "healthy":
        bad = []
        if p["accept_queue"] > 0:
            bad.append(f"healthy load left {p['accept_queue']} in the accept queue")
        # the doctor watches varnishd's manager, whose cache child holds the clients: its own count then
        served = (p["varnish"] or {}).get("MAIN.client_req") if cell.proxy == "varnish" else p["clients"]
        if not served:
            bad.append("no client seen: the paced load did not run")
        return bad
    return [] if holds_cap(cell, p) else [f"harness: the load did not bring {cell.proxy} to its cap: {p}"]


def nginx_requests(port: int) -> tuple[int, float] | None:
    """(requests nginx served so far, monotonic time) from its stub_status page (the cells' nginx have it at
    /nginx_status): the harness's own count of the load, apart from the doctor's."""
    from proxytune.core import sockets
    try:
        status, text = sockets.http_get("127.0.0.1", port, "/nginx_status", sockets.Deadline(5))
    except OSError:
        return None
    m = re.search(r"accepts handled requests\s+[0-9]+\s+[0-9]+\s+([0-9]+)", text)
    return (int(m.group(1)), time.monotonic()) if m else None


# ---------------------------------------------------------------- load

def request(cell: Cell, host_port: str, origin_port: int, path: str = "/") -> bytes:
    url = f"http://127.0.0.1:{origin_port}{path}" if cell.proxy in FORWARD and cell.shape != "slow" else path
    host = f"127.0.0.1:{origin_port}" if cell.proxy in FORWARD else host_port
    return f"GET {url} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: proxytune-matrix\r\n\r\n".encode()


def lua(cell: Cell, origin_port: int) -> str:
    """wrk's script: absolute URLs through a forward proxy; a fresh path per request to the slow origin
    (no coalescing of equal URLs); a 100 ms pause per request when healthy (wrk's `delay`)."""
    prefix = f"http://127.0.0.1:{origin_port}" if cell.proxy in FORWARD and cell.shape != "slow" else ""
    path = '"/slow/" .. math.random(1000000000)' if cell.shape == "slow" else '"/"'
    out = f'request = function()\n  return wrk.format("GET", "{prefix}" .. {path})\nend\n'
    if cell.proxy in FORWARD and cell.shape != "slow":
        out = f'wrk.headers["Host"] = "127.0.0.1:{origin_port}"\n' + out
    if cell.opts.get("gzip"):
        out = 'wrk.headers["Accept-Encoding"] = "gzip"\n' + out
    return out + (f"delay = function()\n  return {cell.delay_ms}\nend\n" if cell.shape == "healthy" else "")


class IdleClients:
    """n keep-alive clients: each connects, sends one request and then holds its connection, reading
    whatever comes. Connects do not wait for accept(): beyond the cap they sit in the accept queue (or
    are retried by the kernel when it is full), and their request is sent once the handshake completes.
    A client the proxy closes dials again (as a browser does on its next request), at most every
    REDIAL_S: nginx closes idle keep-alive connections to reuse them at its cap, and the cap shows only
    while clients keep coming back."""
    REDIAL_S = 0.5

    def __init__(self, port: int, n: int, req: bytes):
        self.port, self.n, self.req = port, n, req
        self.socks: set[socket.socket] = set()
        self.sent = 0
        self.closed = 0               # connections the proxy closed after we sent (EOF or reset)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.sel = selectors.DefaultSelector()

    def _dial(self) -> None:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", self.port))
        self.socks.add(s)
        self.sel.register(s, selectors.EVENT_WRITE)

    def __enter__(self):
        for _ in range(self.n):
            self._dial()
        self.thread.start()
        return self

    def _drop(self, s: socket.socket) -> None:
        self.sel.unregister(s)
        self.socks.discard(s)
        s.close()

    def _event(self, s: socket.socket, events: int) -> bool:
        """Handle one ready socket; True when the proxy closed it."""
        if events & selectors.EVENT_WRITE:
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                self._drop(s)
                return True
            try:
                s.send(self.req)
                self.sent += 1
                self.sel.modify(s, selectors.EVENT_READ)
                return False
            except OSError:
                self._drop(s)
                return True
        try:
            gone = s.recv(65536) == b""
        except BlockingIOError:
            return False
        except OSError:
            gone = True
        if gone:
            self.closed += 1
            self._drop(s)
        return gone

    def _run(self) -> None:
        owed, last = 0, time.monotonic()
        while not self.stop.is_set():
            for key, events in self.sel.select(0.1) if self.sel.get_map() else []:
                owed += self._event(key.fileobj, events)
            if owed and time.monotonic() - last >= self.REDIAL_S:
                for _ in range(owed):
                    self._dial()
                owed, last = 0, time.monotonic()
            if not self.sel.get_map():
                time.sleep(0.1)

    def wait(self, want: int, timeout: float) -> int:
        end = time.monotonic() + timeout
        while self.sent < want and time.monotonic() < end:
            time.sleep(0.1)
        return self.sent

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        for s in list(self.socks):
            s.close()
        self.sel.close()


def wrk(port: int, connections: int, script: Path, seconds: int = 600) -> subprocess.Popen:
    argv = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--timeout", "2s", "-s", str(script),
            f"http://127.0.0.1:{port}/"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_slow_origin(delay: float = SLOW_S) -> tuple[subprocess.Popen, int]:
    import sys
    p = subprocess.Popen([sys.executable, str(Path(__file__).parent / "servers" / "slow_origin.py"),
                          "--delay", str(delay)], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("ready "):
        p.kill()
        raise RuntimeError(f"slow origin did not start: {line!r}")
    return p, int(line.split()[1])


# ---------------------------------------------------------------- the proxy of a cell

def server(cell: Cell, origin: int):
    """The cell's proxy (not started), in front of 127.0.0.1:origin, and the config file its cap is in."""
    from proxytune.microbench import proxyservers, servers
    o = dict(cell.opts)
    if cell.proxy == "haproxy":
        s = proxyservers.HAProxy(origin, cache_mb=0, **o)
        return s, s.conf
    if cell.proxy == "nginx":
        if o.pop("gzip", False):
            return gzip_nginx(o)
        s = servers.Nginx(body=f"proxy_pass http://127.0.0.1:{origin};", **o)
        return s, s.dir / ("events.conf" if o.get("events_include") else "nginx.conf")
    if cell.proxy == "varnish":
        return proxyservers.Varnish(origin, **o), None
    if cell.proxy == "squid":
        # its hard limit above the directive: squid sets its own soft limit from max_filedescriptors
        s = servers.Squid("rock", cache_mb=64, nofile=(1024, 16384),
                          accel_to=origin if cell.shape == "slow" else None, **o)
        return s, s.conf
    s = proxyservers.TrafficServer(origin, cache_mb=64, remap_to=origin if cell.shape == "slow" else None, **o)
    return s, s.conf


GZIP_BYTES = 256 << 10


class WithDir:
    """A server that also owns a directory of files it serves, removed after it stops."""

    def __init__(self, srv, path: Path):
        self.srv, self.path = srv, path

    def __getattr__(self, name):
        return getattr(self.srv, name)

    def __enter__(self):
        self.srv.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            return self.srv.__exit__(*exc)
        finally:
            shutil.rmtree(self.path, ignore_errors=True)


def gzip_nginx(o: dict):
    """nginx serving a 256 KiB text of words, compressed per request at gzip level 9 (its worker's CPU)."""
    import random
    import tempfile
    from proxytune.microbench import servers
    www = Path(tempfile.mkdtemp(prefix="pt-matrix-gzip-"))
    www.chmod(0o755)                              # nginx's workers (nobody) read it
    rnd, words = random.Random(28), ["proxy", "origin", "cache", "accept", "queue", "worker", "loop", "epoll"]
    text = " ".join(f"{rnd.choice(words)}{rnd.randrange(100000)}" for _ in range(GZIP_BYTES // 10))
    (www / "index.txt").write_text(text[:GZIP_BYTES])
    (www / "index.txt").chmod(0o644)
    s = servers.Nginx(body=f"root {www}; index index.txt; default_type text/plain; gzip on; gzip_comp_level 9; "
                           "gzip_types text/plain; gzip_min_length 0;", **o)
    return WithDir(s, www), s.dir / "nginx.conf"


# ---------------------------------------------------------------- the record of each run

def results_line(cell: Cell, run: int, doc: dict, problems: list[str]) -> dict:
    found = doc["findings"]
    return {"cell": cell.name, "proxy": cell.proxy, "shape": cell.shape, "cap": cell.cap, "stats": cell.stats,
            "issue": bool(cell.issue), "run": run, "ids": [f["id"] for f in found],
            "severities": [f["severity"] for f in found], "fix": found[0]["fix"] if found else None,
            "expect": cell.expect, "passed": not problems, "problems": problems,
            "pressure": pressure(doc)}


def append_result(line: dict) -> None:
    path = os.environ.get("PROXYTUNE_MATRIX_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(line, default=str) + "\n")


def evidence_dir(tmp_path: Path) -> Path:
    d = Path(os.environ.get("PROXYTUNE_EVIDENCE_DIR") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


# Open defects, each recorded in issue 22's notes, not hidden: the cell still runs and reports.
KNOWN_OPEN: dict[str, str] = {}

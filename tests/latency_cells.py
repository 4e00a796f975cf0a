"""The latency matrix (issue 28, item 3): where a request's time goes on
real proxies, and what the doctor must say about it. A cell starts its
origin, its proxy and its load once (wrk, running across the looks); the
doctor then looks RUNS times; every look is judged, and wrk's mean latency
over the whole load (the load is steady: each look sees the same) is set
against each look's budget. The cells and the verdicts are data here,
shared by the live matrix (test_matrix_latency.py), the replay of recorded
evidence (test_latency_replay.py) and docs/DIAGNOSIS.md (diagnosis_doc.py).

Shapes:
- fast: a fast origin (nginx answering itself, cacheable), paced load (wrk
  pauses 100 ms between a connection's requests): no budget finding, a
  small total, nothing high or medium.
- slow: a reverse proxy in front of an origin that answers every request
  after DELAY (tests/servers/slow_origin.py, no-store; a fresh path per
  request, so nothing is cached or coalesced): `slow-origin` first, the
  origin named by address, and its measured wait within 25 % of DELAY.
- queue: the proxy's own queue in front of a slower origin, below any
  drop: `proxy-queue` first, naming the directive that makes requests wait
  and where it is set.
The origin's delay is what the test knows; the proxy's and the kernel's
clocks are what the doctor measured.
"""

import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

RUNS = 3
WINDOW = "2"                       # seconds per look
SETTLE_S = 1.5                     # the load's start to the first look: the queue and the connections form
# Traffic Server's clock is its log, read one flush interval back (proxies/trafficserver.py flush_lag:
# max_secs_per_buffer 5 s + 1). The doctor's own start (bpftrace's compile, ~6 s) comes before its window,
# so a first look read the load's first seconds: slower ones (trafficserver-slow400-plain, 2026-11-28:
# 33 requests/s at 480 ms there, 40/s at 401 ms in the next looks), and a per-origin queue that has not grown
# its tail yet (its first 2 s averaged 167 ms, every later 2 s 280-380 ms). Its cells wait the flush
# interval, and a queue's 2 s, longer.
QUEUE_TAIL_S = 2.0
ORIGIN_TOLERANCE = 0.25            # the measured origin wait against the origin's real delay
CLIENT_TOLERANCE = 0.30            # the budget's total against wrk's mean latency
CLOCK_MS = 1.0                     # the proxies' own clocks count whole ms (haproxy, squid, ATS, nginx)
FAST_TOTAL_MS = 40.0               # TCP_DELACK_MIN (include/net/tcp.h): below it, nothing is slow
BUDGET_FINDINGS = ("slow-origin", "proxy-queue", "accept-wait", "proxy-cpu", "loop-lag")
EVIDENCE = Path(__file__).resolve().parent / "evidence" / "latency"
TS_TIMED = ("%<cqtq> %<ttms> %<chi> %<crc>/%<pssc> %<psql> %<cqhm> %<cquc> %<phr>/%<shi> %<nhi> %<nhp> "
            "%<{TS_MILESTONE_SERVER_FIRST_READ-TS_MILESTONE_SERVER_BEGIN_WRITE}msdms> "
            "%<{TS_MILESTONE_SERVER_CONNECT_END-TS_MILESTONE_SERVER_CONNECT}msdms> "
            "%<{TS_MILESTONE_SERVER_CONNECT-TS_MILESTONE_SERVER_FIRST_CONNECT}msdms>")
SQUID_TIMED = "%ts.%03tu %6tr %>a %Ss/%03>Hs %<st %rm %ru %[un %Sh/%<a %mt %<pt %<tt"
QUEUE_DIRECTIVE = {"haproxy": r"maxconn {cap}", "varnish": r"thread_pool_max {cap}",
                   "trafficserver": r"per_server\.connection\.max INT {cap}"}
# Varnish's pool queues its sessions at thread_pool_max, its own cap: that cap's finding comes first (an own cap
# stays first, as in the own-cap matrix) and carries the queue's wait (budget_findings._own_cap_queueing)
QUEUE_FINDING = {"varnish": "varnish-thread-pool"}


def clock_lag_s(proxy: str) -> float:
    """How far back the proxy's own clock reads: Traffic Server's log, one flush interval (its module's
    flush_lag, for the generated records.config's default max_secs_per_buffer)."""
    if proxy != "trafficserver":
        return 0.0
    from proxytune.proxies.trafficserver import flush_lag
    return float(flush_lag({}))


@dataclass(frozen=True)
class Cell:
    name: str
    proxy: str
    shape: str                     # fast | slow | queue
    delay: float                   # the origin's delay per answer (s); 0: the fast origin
    conns: int                     # wrk connections
    stats: bool                    # the proxy's own timing interface (stats socket, timed log, plugin) is on
    what: str                      # the cell's setting in words
    pause_ms: int = 0              # wrk's pause between one connection's requests
    cap: int = 0                   # the queue's limit (queue cells)
    opts: dict = field(default_factory=dict)
    window: str = WINDOW           # seconds per look: longer where few requests carry a long tail

    @property
    def settle_s(self) -> float:
        lag = clock_lag_s(self.proxy)                   # a clock that reads back: also past the queue's growth
        return SETTLE_S + lag + (QUEUE_TAIL_S if lag and self.shape == "queue" else 0.0)

    @property
    def expect(self) -> str:
        return {"fast": "no budget finding, small total", "slow": "slow-origin first, origin named, wait ±25 %",
                "queue": f"{QUEUE_FINDING.get(self.proxy, 'proxy-queue')} first, directive and file:line, "
                         "the queue's wait"}[self.shape]


def _cells() -> list[Cell]:
    c = Cell
    slow = 16
    return [
        # HAProxy: its stats socket on and off; the queue behind `server … maxconn`
        c("haproxy-fast", "haproxy", "fast", 0, 8, True, "paced load, fast origin", pause_ms=100),
        c("haproxy-slow200-stats", "haproxy", "slow", 0.2, slow, True, "origin 200 ms, stats socket"),
        c("haproxy-slow400-nostats", "haproxy", "slow", 0.4, slow, False, "origin 400 ms, no stats socket",
          opts={"stats_socket": False}),
        c("haproxy-queue-mc4", "haproxy", "queue", 0.05, 32, True, "server maxconn 4, 32 clients, origin 50 ms",
          cap=4, opts={"server_maxconn": 4}),
        c("haproxy-queue-mc8", "haproxy", "queue", 0.02, 64, True, "server maxconn 8, 64 clients, origin 20 ms",
          cap=8, opts={"server_maxconn": 8}),
        # Varnish (its shared memory always there): few workers, clients paced past timeout_linger (50 ms) so
        # a worker is freed after each answer, the queue below thread_queue_limit (20 per pool)
        c("varnish-fast", "varnish", "fast", 0, 8, True, "paced load, fast origin (cached)", pause_ms=100),
        c("varnish-slow250", "varnish", "slow", 0.25, slow, True, "origin 250 ms"),
        c("varnish-slow500", "varnish", "slow", 0.5, slow, True, "origin 500 ms"),
        # A request holds a worker for the origin's 100 ms (its fetch one more) and timeout_linger after it;
        # with the acceptor's thread, thread_pool_max 10 serves about 36 requests a second: 16 clients
        # pausing 100 ms offer more, and the rest wait in the pool's queue (about 9 deep, below the 20 of
        # thread_queue_limit). A pool with queued sessions does not run its acceptor (its task comes after
        # them): the threads are there from the start (thread_pool_min = max), so every client is accepted
        # before the queue forms and none waits unaccepted for the whole cell
        c("varnish-queue-max10x1", "varnish", "queue", 0.1, 16, True,
          "thread_pool_max 10, 1 pool, 16 paced clients, origin 100 ms", pause_ms=100, cap=10,
          opts={"params": {"thread_pool_min": 10, "thread_pool_max": 10, "thread_pools": 1}}),
        c("varnish-queue-max20x1", "varnish", "queue", 0.1, 30, True,
          "thread_pool_max 20, 1 pool, 30 paced clients, origin 100 ms", pause_ms=100, cap=20,
          opts={"params": {"thread_pool_min": 20, "thread_pool_max": 20, "thread_pools": 1}}),
        # Squid: its logformat with %<pt (and the cache manager) or the built-in one (manager denied)
        c("squid-fast", "squid", "fast", 0, 8, True, "forward proxy, paced load, fast origin", pause_ms=100),
        c("squid-slow300-timed", "squid", "slow", 0.3, slow, True, "accel, origin 300 ms, logformat with %<pt",
          opts={"logformat": SQUID_TIMED}),
        c("squid-slow150-plain", "squid", "slow", 0.15, slow, False,
          "accel, origin 150 ms, logformat squid, manager denied", opts={"manager": False}),
        # Traffic Server: milestones in its log and stats_over_http, or neither; its per-origin queue
        c("trafficserver-fast", "trafficserver", "fast", 0, 8, True, "forward proxy, paced load, fast origin",
          pause_ms=100, opts={"log_format": TS_TIMED}),
        c("trafficserver-slow200-timed", "trafficserver", "slow", 0.2, slow, True,
          "remap, origin 200 ms, milestones in the log, stats_over_http", opts={"log_format": TS_TIMED}),
        c("trafficserver-slow400-plain", "trafficserver", "slow", 0.4, slow, False,
          "remap, origin 400 ms, squid log format, no stats plugin", opts={"stats_plugin": False}),
        c("trafficserver-queue-max4", "trafficserver", "queue", 0.05, 24, True,
          "per_server.connection.max 4 (queue_size -1), 24 clients, origin 50 ms", cap=4,
          opts={"log_format": TS_TIMED, "records": _ts_queue(4)}, window="6"),
        c("trafficserver-queue-max8", "trafficserver", "queue", 0.02, 48, True,
          "per_server.connection.max 8 (queue_size -1), 48 clients, origin 20 ms", cap=8,
          opts={"log_format": TS_TIMED, "records": _ts_queue(8)}, window="6"),
        # nginx: no queue in OSS; upstream times in its log_format, or access_log off
        c("nginx-fast", "nginx", "fast", 0, 8, True, "paced load, fast origin", pause_ms=100,
          opts={"timed_log": True}),
        c("nginx-slow300-timed", "nginx", "slow", 0.3, slow, True, "origin 300 ms, log_format with upstream times",
          opts={"timed_log": True}),
        c("nginx-slow150-off", "nginx", "slow", 0.15, slow, False, "origin 150 ms, access_log off"),
    ]


def _ts_queue(cap: int) -> dict:
    return {"proxy.config.http.per_server.connection.max": ("INT", cap),
            "proxy.config.http.per_server.connection.queue_size": ("INT", -1)}


CELLS = _cells()
BY_NAME = {c.name: c for c in CELLS}
# What `make test` runs: every mechanism once within CI's time (each cell ~23 s here: the full matrix is 8 min,
# LEAN 4): each proxy's own clock behind a slow origin, each proxy's own queue, a fast proxy with idle event
# loops (Traffic Server) or a cache in front (Varnish), and the kernel alone behind origin connections reused
# within a jiffy (HAProxy without its stats socket: the triage's origin_wait.bt); LEAN is about 4 min. The kernel's mechanisms alone (nginx without its own
# clock, two delays) and a fast nginx are tests/test_budget_live.py's. The full matrix, for docs/DIAGNOSIS.md
# and a change to a rule: PROXYTUNE_LATENCY_FULL=1.
# Varnish's and Traffic Server's queue cells play in the full matrix only (about 40 s each, CI's hour is full);
# their clocks' queues are read live in CI by test_owntime_live.py and their recorded looks replay in CI.
LEAN = ("varnish-fast", "trafficserver-fast",
        "haproxy-slow200-stats", "varnish-slow250", "squid-slow300-timed", "trafficserver-slow200-timed",
        "nginx-slow300-timed", "haproxy-queue-mc4", "haproxy-slow400-nostats")


def selected() -> list[Cell]:
    """The cells this run plays: LEAN, or every cell with PROXYTUNE_LATENCY_FULL set."""
    return list(CELLS) if os.environ.get("PROXYTUNE_LATENCY_FULL") else [BY_NAME[n] for n in LEAN]


# ---------------------------------------------------------------- the proxy and the load of a cell

def server(cell: Cell, origin: int):
    """The cell's proxy (not started) in front of 127.0.0.1:origin, and its config file: the own-cap
    matrix's servers, a reverse proxy (squid accel, ATS remap) except in front of the fast origin."""
    import matrix
    return matrix.server(SimpleNamespace(proxy=cell.proxy, opts=cell.opts,
                                         shape="healthy" if cell.shape == "fast" else "slow"), origin)


def lua(cell: Cell, origin_port: int) -> str:
    """wrk's script: a fresh path per request to a slow or queueing origin (no caching, no coalescing),
    the same cacheable path to the fast one (absolute URLs through a forward proxy), a pause when paced."""
    forward = cell.shape == "fast" and cell.proxy in ("squid", "trafficserver")
    prefix = f"http://127.0.0.1:{origin_port}" if forward else ""
    path = '"/"' if cell.shape == "fast" else '"/t/" .. math.random(1000000000)'
    out = (f'wrk.headers["Host"] = "127.0.0.1:{origin_port}"\n' if forward else "") + \
        f'request = function()\n  return wrk.format("GET", "{prefix}" .. {path})\nend\n'
    return out + (f"delay = function()\n  return {cell.pause_ms}\nend\n" if cell.pause_ms else "")


def wrk(port: int, conns: int, script: Path) -> subprocess.Popen:
    """wrk for as long as the cell lasts (SIGINT ends it with its summary on stdout)."""
    # --timeout is also the top of wrk's histogram (stats_alloc(timeout)): a request slower is left out of its
    # mean (stats_record refuses it, errors.timeout), so it sits far above any queue's tail here
    return subprocess.Popen(["wrk", "-t2", f"-c{conns}", "-d600s", "--timeout", "30s", "-s", str(script),
                             f"http://127.0.0.1:{port}/"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)


UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def wrk_summary(out: str) -> dict:
    """wrk's mean and max latency (ms), connections, requests, run time, errors from its summary."""
    lat = re.search(r"Latency\s+([0-9.]+)(us|ms|s|m)\s+[0-9.]+(?:us|ms|s|m)\s+([0-9.]+)(us|ms|s|m)\s", out)
    mean = re.search(r"Latency\s+([0-9.]+)(us|ms|s|m)\s", out)
    conns = re.search(r"threads and ([0-9]+) connections", out)
    reqs = re.search(r"([0-9]+) requests in ([0-9.]+)(m|s|ms)\b", out)
    errs = re.search(r"Socket errors: connect ([0-9]+), read ([0-9]+), write ([0-9]+), timeout ([0-9]+)", out)
    non2 = re.search(r"Non-2xx or 3xx responses: ([0-9]+)", out)
    return {"mean_ms": round(float(mean.group(1)) * UNITS[mean.group(2)], 3) if mean else None,
            "max_ms": round(float(lat.group(3)) * UNITS[lat.group(4)], 3) if lat else None,
            "connections": int(conns.group(1)) if conns else None,
            "requests": int(reqs.group(1)) if reqs else None,
            "runtime_ms": round(float(reqs.group(2)) * UNITS[reqs.group(3)], 1) if reqs else None,
            "errors": dict(zip(("connect", "read", "write", "timeout"), map(int, errs.groups()))) if errs else {},
            "non_2xx": int(non2.group(1)) if non2 else 0}


def client_mean(w: dict, pause_ms: float = 0) -> tuple[float | None, str]:
    """The mean time of the requests wrk completed, and how it is known. wrk's printed mean is not always
    it: before printing, wrk.c corrects its histogram for coordinated omission (stats_correct): with the
    expected interval E = run time / (requests / connections), every latency L above 2E adds samples
    L - E, L - 2E, ... down to E. A load whose latencies have a tail beyond 2E (a polled, unfair queue: Traffic
    Server's per-origin queue, p99 at ten times the mean) reads up to twice its real mean (live: 643 ms printed,
    315 ms in the proxy's log of the same 1,144 requests). When wrk's max is at most 2E nothing was added: its
    mean is the mean. Else (and no request passed wrk's --timeout, which its mean leaves out) two figures
    bound the mean from above: the printed one (every added sample is above
    E, and E, a connection's whole cycle, is at least the mean) and Little's law on wrk's own counts
    (connections x run time / requests - pause: each connection holds one request but for its pause; one
    starved in an accept queue, or idle, counts as if it waited); the smaller is taken and named."""
    mean, top, c, n, t = (w.get(k) for k in ("mean_ms", "max_ms", "connections", "requests", "runtime_ms"))
    if not (c and n and t) or top is None or not n // c:
        return mean, "wrk's printed mean"
    expected, little = t / (n // c), round(c * t / n - pause_ms, 3)
    law = f"Little's law on wrk's counts ({c} connections x {t / 1000:g} s / {n} requests" + \
        (f" - {pause_ms:g} ms pause" if pause_ms else "") + ")"
    if little <= 0:
        return mean, f"wrk's printed mean ({law} gives {little} ms: too few requests)"
    timeouts = (w.get("errors") or {}).get("timeout")
    if timeouts:                        # a request past --timeout is not in wrk's mean; it is in Little's law
        return little, f"{law}: {timeouts} request(s) past wrk's timeout are not in its mean"
    if top <= 2 * expected:
        return mean, f"wrk's printed mean (max {top:g} ms <= 2 x its interval {expected:.1f} ms: not corrected)"
    why = f"wrk's mean is corrected for coordinated omission (max {top:g} ms > 2 x {expected:.1f} ms)"
    if mean is not None and mean <= little:
        return mean, f"wrk's printed mean, below {law}'s {little} ms: {why}"
    return little, f"{law}, below its printed mean {mean} ms: {why}"


def where_set(cell: Cell, conf: Path | None) -> str:
    """Where the queue's directive is: `file:line` in the generated config, or varnishd's command line."""
    if cell.proxy == "varnish":
        return "command line"
    pat = re.compile(QUEUE_DIRECTIVE[cell.proxy].format(cap=cell.cap) + r"\b")
    for n, line in enumerate(conf.read_text().splitlines(), 1):
        if pat.search(line):
            return f"{conf}:{n}"
    raise AssertionError(f"{pat.pattern} not in {conf}")


# ---------------------------------------------------------------- the verdict on one look

def budget_of(doc: dict) -> dict:
    """The doctor's budget in its --json answer (data.budget)."""
    return (doc.get("data") or doc).get("budget") or {}


def origin_wait(doc: dict, addr: str) -> float | None:
    """The budget's origin wait for the origin at addr (ms): its by_origin entry, else the part's mean."""
    part = (budget_of(doc).get("parts") or {}).get("origin_first_byte") or {}
    got = (part.get("by_origin") or {}).get(addr) or {}
    return got.get("ms") if got.get("ms") is not None else part.get("ms")


def origin_bound(doc: dict, addr: str) -> float | None:
    """The upper bound of the origin's wait when the budget could only bound it (else None)."""
    part = (budget_of(doc).get("parts") or {}).get("origin_first_byte") or {}
    if not part.get("at_least"):
        return None
    got = (part.get("by_origin") or {}).get(addr) or {}
    return got.get("ms_upper") if got.get("ms_upper") is not None else part.get("ms_upper")


def agreement(doc: dict, client_ms: float | None) -> dict:
    """The budget's total against wrk's mean: within CLIENT_TOLERANCE, or within what the clocks can resolve
    (CLOCK_MS, or what the parts state: haproxy's window mean solved from a whole-ms sliding mean is ±6 ms at
    80 requests/s, a kernel part sampled at ticks resolves 1000 / (ticks x rate) ms). A total with a part the kernel could only bound (`at_least`) is a lower bound:
    it agrees when wrk's mean lies between it and the total with that part's upper bound."""
    b = budget_of(doc)
    total = b.get("total_ms")
    if total is None or not client_ms:
        return {"total_ms": total, "client_ms": client_ms, "agrees": False, "why": "no total or no wrk mean"}
    parts = [p for p in (b.get("parts") or {}).values() if p.get("measurable")]
    # what the clocks resolve: a proxy clock's stated half-width; a kernel part's resolution (Little's law on
    # ticks: one socket seen at one tick of nine, at 80 requests/s, is 1.4 ms per request)
    stated = sum((p.get("uncertainty_ms") or 0) + (p.get("resolution_ms") or 0) for p in parts)
    slack = max(CLIENT_TOLERANCE * client_ms, CLOCK_MS, stated)
    upper = total + sum((p.get("ms_upper") or 0) - (p.get("ms") or 0) for p in parts if p.get("at_least"))
    ok = total - slack <= client_ms <= upper + slack
    out = {"total_ms": total, "client_ms": client_ms, "ratio": round(total / client_ms, 3), "agrees": ok}
    return {**out, "upper_ms": round(upper, 3), "bounded": True} if upper > total else out


def verdict_problems(cell: Cell, doc: dict, m: dict) -> list[str]:
    """What is wrong with one doctor answer for this cell (empty: it holds). m: the look's facts the test
    knows (the origin's address, where the queue's directive is, wrk's mean)."""
    found = doc.get("findings") or []
    ids = [f["id"] for f in found]
    budget = budget_of(doc)
    out = []
    if not budget:
        return ["no budget in the doctor's answer"]
    agree = agreement(doc, m.get("client_ms"))
    if not agree["agrees"]:
        out.append(f"budget total {agree['total_ms']} ms vs the clients' mean {agree['client_ms']} ms "
                   f"({m.get('client_how') or 'wrk'}): not within "
                   f"{int(CLIENT_TOLERANCE * 100)} %")
    if cell.shape == "fast":
        loud = [f"{f['id']} ({f['severity']})" for f in found if f["id"] in BUDGET_FINDINGS
                or f["severity"] in ("high", "medium")]
        if loud:
            out.append(f"fast proxy, yet: {', '.join(loud)}")
        # small: below what TCP alone can add to one exchange (TCP_DELACK_MIN, the budget's SIGNIFICANT_MS);
        # which part holds a sub-ms total is noise of ms clocks, not a verdict
        if (budget.get("total_ms") or 0) >= FAST_TOTAL_MS:
            out.append(f"fast proxy, yet a budget total of {budget['total_ms']} ms")
        return out
    want = "slow-origin" if cell.shape == "slow" else QUEUE_FINDING.get(cell.proxy, "proxy-queue")
    if not ids or ids[0] != want:
        return out + [f"first finding {ids[:1] or 'none'}, expected {want} (all: {ids})"]
    text = json.dumps(found[0], default=str)
    if cell.shape == "slow":
        if m["origin"] not in text:
            out.append(f"slow-origin does not name the origin {m['origin']}")
        wait, most = origin_wait(doc, m["origin"]), origin_bound(doc, m["origin"])
        real = cell.delay * 1000
        if most is not None:              # the kernel alone could only bound it: the bounds must hold the delay
            if wait is None or not wait * (1 - ORIGIN_TOLERANCE) <= real <= most * (1 + ORIGIN_TOLERANCE):
                out.append(f"origin wait bounded {wait}-{most} ms, real delay {real:g} ms: not within the bounds")
            if "at least" not in found[0].get("title", ""):
                out.append("slow-origin gives a lower bound as the wait: its title must say 'at least'")
        elif wait is None or abs(wait - real) > ORIGIN_TOLERANCE * real:
            out.append(f"measured origin wait {wait} ms, real delay {real:g} ms: not within 25 %")
    else:
        if not re.search(QUEUE_DIRECTIVE[cell.proxy].format(cap=cell.cap).replace(" INT ", ".*") + r"\b", text):
            out.append(f"proxy-queue does not name the directive ({QUEUE_DIRECTIVE[cell.proxy].format(cap=cell.cap)})")
        if m["where"] not in text:
            out.append(f"proxy-queue does not say where it is set ({m['where']})")
        wait = (found[0].get("evidence") or {}).get("queue_wait_ms_per_request" if want != "proxy-queue"
                                                     else "wait_ms_per_request")
        if not wait:
            out.append(f"{want} does not carry the queue's wait per request")
    return out


def condition_problems(cell: Cell, doc: dict, m: dict) -> list[str]:
    """Did the load make the cell's condition? (a harness failure, not the rule's)"""
    ev = doc["data"]["evidence"] if "data" in doc else doc.get("evidence", {})
    out = []
    if not (m.get("wrk") or {}).get("requests"):
        out.append("harness: wrk completed no request")
    errors = sum(((m.get("wrk") or {}).get("errors") or {}).values()) + (m.get("wrk") or {}).get("non_2xx", 0)
    if errors > 0.01 * ((m.get("wrk") or {}).get("requests") or 1):
        out.append(f"harness: wrk saw errors {m['wrk']['errors']} / non-2xx {m['wrk'].get('non_2xx')}: "
                   "the queue dropped or the origin failed")
    if cell.shape == "queue":
        from proxytune import proxies as kinds
        kind = kinds.by_kind(cell.proxy)
        q = (kind.time_parts(ev.get("proxy") or {})["parts"].get("proxy_queue") or {})
        if not ((q.get("cause") or {}).get("queue_max") or q.get("ms")):
            out.append(f"harness: {cell.proxy} did not queue (its own count): {q.get('cause')}")
    return out


def look_facts(cell: Cell, origin_port: int, where: str | None, client: dict) -> dict:
    ms, how = client_mean(client, cell.pause_ms or 0)
    return {"origin": f"127.0.0.1:{origin_port}", "where": where, "wrk": client, "client_ms": ms,
            "client_how": how, "delay_ms": cell.delay * 1000}


def results_line(cell: Cell, run: int, doc: dict, m: dict, problems: list[str]) -> dict:
    found = doc.get("findings") or []
    budget = budget_of(doc)
    return {"cell": cell.name, "proxy": cell.proxy, "shape": cell.shape, "what": cell.what, "stats": cell.stats,
            "run": run, "ids": [f["id"] for f in found], "severities": [f["severity"] for f in found],
            "first": found[0] if found else None, "expect": cell.expect, "passed": not problems,
            "problems": problems, "delay_ms": m["delay_ms"], "origin": m["origin"],
            "origin_wait_ms": origin_wait(doc, m["origin"]) if cell.shape != "fast" else None,
            "origin_wait_upper_ms": origin_bound(doc, m["origin"]) if cell.shape != "fast" else None,
            "agreement": agreement(doc, m.get("client_ms")), "client_how": m.get("client_how"),
            "budget_text": budget_text(doc),
            "budget": {k: budget.get(k) for k in ("total_ms", "dominant", "unmeasured")},
            "parts_ms": {k: (v or {}).get("ms") for k, v in (budget.get("parts") or {}).items()}}


def budget_text(doc: dict) -> str:
    """The budget as the doctor prints it in the terminal (probes/render.py time_budget), as plain text."""
    from rich.console import Console
    from proxytune.probes import render
    with open(os.devnull, "w") as null:
        con = Console(width=400, color_system=None, record=True, file=null)
        render.time_budget(con, budget_of(doc) or None)
    return con.export_text().strip()


def append_result(line: dict) -> None:
    path = os.environ.get("PROXYTUNE_LATENCY_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(line, default=str) + "\n")

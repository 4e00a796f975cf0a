"""HAProxy's own clocks: `show stat` on its stats socket, read when the
doctor's window starts and ends, and its queue lengths sampled in between.

What the figures are (haproxy 2.6 src/stream.c stream_update_time_stats,
called when a stream ends): for each request that got a server connection
and a response (t_connect and t_data set; a failed request adds nothing),
qtime = time in the backend's or server's queue, ctime = time to connect
to the server, rtime = from the connection to the response headers (the
origin's first byte, as haproxy saw it), ttime = the whole stream. Each is
kept per backend and per server as a sliding mean: the sum of the values
while the counter cum_req (req_tot) is at most TIME_STATS_SAMPLES = 1024,
then sum += v - sum/1024 (include/haproxy/freq_ctr.h swrate_add_dynamic),
shown as sum / min(cum_req, 1024) in whole ms (src/stats.c). Both
readings together give the mean of the requests in the window (see
window_mean): exact arithmetic, not an assumption about the load.

ttime is not the request's time: on a keep-alive connection the stream's
clock starts when the previous request ended (src/mux_h1.c h1_detach resets
sess->tv_accept), so it holds the client's pause between requests. The
proxy's own total is qtime + ctime + rtime instead (the request's receipt
and the body's transfer are left out).

Requests queue only behind a server's `maxconn` (or when every server is
full or down: the backend's queue): src/queue.c pendconn_add, configuration
manual 5.2 "maxconn"; qcur is each queue's length now (a gauge), qmax its
peak since start.
"""

import csv
import re

from proxytune.core import sockets
from proxytune.core.numbers import uint

from .base import STATS_SECONDS
from .timing import (Sampler, Unavailable, Window, answer, nothing, origin_entry, part, split_address, unmeasurable)

SAMPLES = 1024                  # TIME_STATS_SAMPLES (include/haproxy/defaults.h)
KEEP = ("qcur", "qmax", "scur", "slim", "stot", "req_tot", "econ", "eresp", "cli_abrt", "srv_abrt", "wretr",
        "qtime", "ctime", "rtime", "ttime", "qtime_max", "ctime_max", "rtime_max", "ttime_max", "type")
MAX_ROWS = 512
SAMPLE_EVERY = 0.5              # seconds between two readings of the queues
MECH = "haproxy `show stat` (src/stream.c stream_update_time_stats)"
ADDR = re.compile(r"\[?[0-9A-Fa-f.:]{2,45}\]?:[0-9]{1,5}", re.A)
NAME = re.compile(r"[A-Za-z0-9_.:@-]{1,64}", re.A)


def read_stat(pid: int, path: str, proc: int | None) -> list[dict]:
    """`show stat` as rows (frontends 0, backends 1, servers 2), numbers as ints, names checked."""
    raw = sockets.unix_query(pid, path, b"show stat\n", sockets.Deadline(STATS_SECONDS), proc)
    lines = raw.decode(errors="replace").splitlines()
    if not lines or not lines[0].startswith("# "):
        raise ValueError("`show stat` gave no CSV header")
    rows = []
    for rec in csv.DictReader([lines[0][2:]] + lines[1:MAX_ROWS + 1]):
        px, sv = rec.get("pxname") or "", rec.get("svname") or ""
        if not (NAME.fullmatch(px) and NAME.fullmatch(sv)):
            continue
        row = {"px": px, "sv": sv, **{k: n for k in KEEP if (n := uint(rec.get(k) or "")) is not None}}
        if ADDR.fullmatch(rec.get("addr") or ""):
            row["addr"] = rec["addr"]
        rows.append(row)
    return rows


def queues(rows: list[dict]) -> dict:
    """qcur of every backend and server: 'backend' or 'backend/server' -> length."""
    return {key(r): r["qcur"] for r in rows if r.get("type") in (1, 2) and "qcur" in r}


def key(r: dict) -> str:
    return r["px"] if r.get("type") == 1 else f"{r['px']}/{r['sv']}"


def server_lines(lines) -> list[dict]:
    """Every `server` line with its backend (or listen section), address, maxconn and file:line; a
    `default-server maxconn` of the section or of `defaults` applies where the line has none."""
    out, section, dflt, dflt_section = [], None, None, None
    for ln in lines:
        words = ln.text.split("#", 1)[0].split()
        if not words:
            continue
        if not ln.text[:1].isspace():
            section = words[1] if words[0] in ("backend", "listen") and len(words) > 1 else None
            dflt_section = None
            if words[0] == "defaults":
                dflt, section = None, "defaults"
            continue
        if words[0] == "default-server" and section:
            mc = _maxconn(words)
            if section == "defaults":
                dflt = mc
            else:
                dflt_section = mc
        elif words[0] == "server" and len(words) > 2 and section not in (None, "defaults") and len(out) < MAX_ROWS:
            mc = _maxconn(words)
            out.append({"backend": section, "server": words[1], "addr": words[2],
                        "maxconn": mc if mc is not None else (dflt_section if dflt_section is not None else dflt),
                        "text": " ".join(words)[:200], "file": ln.file, "line": ln.number})
    return out


def _maxconn(words: list[str]) -> int | None:
    for i, w in enumerate(words[:-1]):
        if w == "maxconn":
            return uint(words[i + 1])
    return None


class Clock(Window):
    """`show stat` at the window's start and end, the queues every SAMPLE_EVERY seconds between."""

    def __init__(self, proxy, path: str):
        super().__init__(proxy)
        self.path, self.source = path, f"show stat on {path}"
        self.sampler: Sampler | None = None

    def _read(self) -> list[dict]:
        return read_stat(self.proxy.pid, self.path, self.proxy.proc)

    def begin(self):
        self.data["servers"] = server_lines(self.proxy.lines)
        self.data["before"] = self._read()
        self.sampler = Sampler(lambda: queues(self._read()), SAMPLE_EVERY).start()

    def end(self):
        if self.sampler:
            self.data["queue_samples"] = self.sampler.stop()
        self.data["after"] = self._read()


def timing(proxy) -> Window:
    path = (proxy.conf.get("stats socket") or {}).get("value")
    if not path or not path.startswith("/"):
        return Unavailable(proxy, "no `stats socket` in the global section: haproxy's own timers are not readable")
    return Clock(proxy, path)


# ---------------------------------------------------------------- pure: the window's means

def window_mean(a0: int, a1: int, n0: int, n1: int) -> tuple[float, float] | None:
    """(mean of the requests between two readings, its half-width of uncertainty) from haproxy's
    sliding mean a0 at cum_req n0 and a1 at n1 (whole ms, rounded up by swrate_avg). While n <= 1024
    the mean is sum / n; past it, each request decays the sum by 1/1024, so a reading is an
    exponential mean: solved for the window's value, taken constant across the window."""
    dn = n1 - n0
    if dn <= 0:
        return None
    s0, s1 = _mid(a0), _mid(a1)
    if n1 <= SAMPLES:
        return max(0.0, (s1 * n1 - s0 * n0) / dn), (n1 + n0) / (2 * dn)
    b = 1 - 1 / SAMPLES
    if n0 >= SAMPLES:
        keep = b ** dn
        return max(0.0, (s1 - s0 * keep) / (1 - keep)), (1 + keep) / (2 * (1 - keep))
    keep = b ** (n1 - SAMPLES)                                 # the counter crossed 1024 in the window
    weight = (SAMPLES - n0) / SAMPLES * keep + 1 - keep
    return max(0.0, (s1 - s0 * n0 / SAMPLES * keep) / weight), (1 + n0 / SAMPLES * keep) / (2 * weight)


def _mid(a: int) -> float:
    """The middle of what a shown mean can stand for: swrate_avg rounds up, so a shown 3 is a sum/n
    in (2, 3]; a shown 0 is a sum of 0."""
    return a - 0.5 if a > 0 else 0.0


def _rows(t: dict, when: str) -> dict:
    return {key(r): r for r in t.get(when) or [] if isinstance(r, dict) and "px" in r}


def _count(r: dict) -> int | None:
    v = r.get("req_tot", r.get("stot"))
    return v if isinstance(v, int) else None


def _mean_of(metric: str, a: dict, b: dict) -> tuple[float, float, int] | None:
    n0, n1 = _count(a), _count(b)
    if n0 is None or n1 is None or not isinstance(a.get(metric), int) or not isinstance(b.get(metric), int):
        return None
    got = window_mean(a[metric], b[metric], n0, n1)
    return (got[0], got[1], n1 - n0) if got else None


def _precision(worst: float, n: int) -> str:
    return (f"±{worst:.1f} ms: window mean of {n} requests solved from haproxy's sliding mean over its last "
            f"{SAMPLES} requests (whole ms) read at the window's start and end")


def parts(p: dict) -> dict:
    """The parts haproxy's own timers show for the window (pure, over ev["proxy"])."""
    t = p.get("timing") or {}
    if not t.get("available"):
        return nothing(t.get("reason") or "haproxy's `show stat` was not read in this window", MECH)
    b0, b1 = _rows(t, "before"), _rows(t, "after")
    grew = lambda kind: [(k, b0[k], b1[k]) for k in b1 if b1[k].get("type") == kind and k in b0]
    fe = grew(0)
    clients = sum(max(0, (_count(b) or 0) - (_count(a) or 0)) for _, a, b in fe) if fe else None
    conf = {f"{s['backend']}/{s['server']}": s for s in t.get("servers") or []}
    servers, backends = grew(2), grew(1)
    out = {"origin_connect": _per_server("ctime", servers, conf, "connecting to the server"),
           "origin_first_byte": _per_server("rtime", servers, conf, "from the server connection to the response "
                                                                   "headers")}
    out["proxy_queue"] = _queue(t, backends, servers, conf)
    return answer(out, _total(out), clients, "show stat req_tot delta of frontend(s) "
                  + ", ".join(k.split("/")[0] for k, _, _ in fe)[:200] if fe else "no frontend in show stat")


def _per_server(metric: str, servers, conf: dict, what: str) -> dict:
    total, n, worst, by = 0.0, 0, 0.0, {}
    for k, a, b in servers:
        got = _mean_of(metric, a, b)
        if not got or not got[2]:
            continue
        mean, err, dn = got
        total, n, worst = total + mean * dn, n + dn, max(worst, err)
        c = conf.get(k) or {}
        addr = split_address(b.get("addr") or c.get("addr") or "") or k
        by[addr] = origin_entry(f"backend {k.split('/')[0]}, server {k.split('/')[1]}",
                                f"{c['file']}:{c['line']}" if c.get("line") else None, mean, dn)
    if not n:
        return unmeasurable(f"no request completed with a server in the window ({metric})", MECH)
    return part(total / n, f"{MECH}: {metric}, {what}", _precision(worst, n), samples=n, requests=n,
                population="requests that went to a server", by_origin=by)


def _queue(t: dict, backends, servers, conf: dict) -> dict:
    total, n, worst = 0.0, 0, 0.0
    for _, a, b in backends:                    # a backend's qtime holds its servers' queues too
        got = _mean_of("qtime", a, b)
        if got and got[2]:
            total, n, worst = total + got[0] * got[2], n + got[2], max(worst, got[1])
    if not n:
        return unmeasurable("no backend request completed in the window (qtime)", MECH)
    samples = [s for s in t.get("queue_samples") or [] if isinstance(s, dict)]
    lengths = [sum(v for v in s.values() if isinstance(v, int)) for s in samples]
    window = t.get("window_s") or 0
    check = None
    if lengths and window:          # Little's law: mean queue length / request rate = wait per request
        check = {"little_ms": round(sum(lengths) / len(lengths) / (n / window) * 1000, 3),
                 "queue_mean": round(sum(lengths) / len(lengths), 2), "queue_samples": len(lengths),
                 "how": f"Little's law: qcur sampled every {SAMPLE_EVERY:g} s / the backends' requests per second"}
    return part(total / n, f"{MECH}: qtime, in the backend's and servers' queues (src/queue.c)",
                _precision(worst, n), samples=n, requests=n, population="requests that reached a backend",
                cause=_cause(samples, servers, conf), check=check)


def _cause(samples: list[dict], servers, conf: dict) -> dict | None:
    """The server whose `maxconn` queues requests (the longest sampled queue), as configured."""
    limited = [(k, b) for k, _, b in servers if (conf.get(k) or {}).get("maxconn") or b.get("slim")]
    if not limited:
        return None
    peak = {k: max((s.get(k) or 0 for s in samples), default=0) for k, _ in limited}
    k, b = max(limited, key=lambda kb: (peak[kb[0]], kb[1].get("qmax") or 0))
    c = conf.get(k) or {}
    total = [sum(v for v in s.values() if isinstance(v, int)) for s in samples]
    backend, server = k.split("/", 1)
    return {"directive": c.get("text") or f"server {server} maxconn {b.get('slim')}",
            "where": f"{c['file']}:{c['line']}" if c.get("line") else "not in the config read",
            "limit": c.get("maxconn") or b.get("slim"), "queue_now": total[-1] if total else b.get("qcur"),
            "queue_max": max(total) if total else None, "queue_max_since_start": b.get("qmax"),
            "what": f"backend {backend}, server {server}"}


def _total(out: dict) -> dict:
    """qtime + ctime + rtime: haproxy's own time from the request to the response headers."""
    got = [out[k] for k in ("proxy_queue", "origin_connect", "origin_first_byte")]
    if not all(g["measurable"] for g in got):
        return unmeasurable("one of qtime, ctime, rtime is missing", MECH)
    return part(sum(g["ms"] for g in got), f"{MECH}: qtime + ctime + rtime (ttime holds keep-alive pauses: "
                "src/mux_h1.c h1_detach restarts the stream clock when the previous request ends)",
                "the three parts' precisions added; the request's receipt and the body's transfer are left out",
                samples=got[0]["samples"], requests=got[0]["requests"], population="requests that reached a backend")


def config_origins(lines) -> dict:
    out = {}
    for s in server_lines(lines):
        addr = split_address(s["addr"])
        if addr:
            out.setdefault(addr, {"name": f"backend {s['backend']}, server {s['server']}",
                                  "where": f"{s['file']}:{s['line']}"})
    return out

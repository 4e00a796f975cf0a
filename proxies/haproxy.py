"""HAProxy: `haproxy -f CFG` (several -f, or a directory of *.cfg), its
`stats socket` for `show info`, and its caps.

How it counts and refuses (src/listener.c, listener_accept): every accepted
client connection is a session; while actconn >= global.maxconn, or a
frontend's feconn >= its maxconn, the listener is limited (limit_listener)
and no longer polled, so new clients wait in the kernel's accept queue.
A frontend without `maxconn` (nor one in `defaults`) gets the global
maxconn (src/proxy.c proxy_adjust_all_maxconn). A global maxconn not
written is derived from the fd limit at start and is then the cap like a
written one (global_maxconn below says how HAProxy 2.6 computes it). Sessions
are read from `show info` when there is a stats socket, and always from the
client sockets the process holds on its own listening ports (connsample),
never from fds / 2: an idle client holds no server connection, so a proxy at
a derived maxconn holds only about half its fd limit.
"""

import csv
import os
import re

from pathlib import Path

from proxytune.core import sockets
from proxytune.core.numbers import is_uint, uint

from .base import STATS_SECONDS, Running, Spec, as_int, directives, nofile_now, option, peak, where
from .timing import (Sampler, Unavailable, Window, answer, nothing, origin_entry, part, split_address, unmeasurable)
from .cap import Cap
from .launch import Server, dead_resolver, free_port, limited, need, tempdir

SOURCE = "haproxy src/listener.c listener_accept/limit_listener; maxconn in the configuration manual, section 3.2/4.2"
DERIVED_SOURCE = "haproxy 2.6 src/haproxy.c init()/compute_ideal_maxconn; src/listener.c listener_backlog"
# HAProxy 2.6 when no maxconn is written (src/haproxy.c init(), compute_ideal_maxconn(), v2.6.0):
#   remain  = max(soft, hard) RLIMIT_NOFILE at start, capped by `fd-hard-limit`
#   remain -= global.maxsock: RESERVED_FDS, plus one per listening socket (cfgparse-listen.c, cli.c), the
#             stats socket's frontend maxconn (`stats maxconn`, CLI_MAXCONN by default: haproxy.c adds
#             global.cli_fe->maxconn), one per server `check` and `agent-check` (check.c), and in master-worker
#             mode (-W, -Ws, `master-worker`) the worker's socketpair listener on that same CLI frontend (which
#             it creates when no stats socket did) plus, per master CLI listener (-S), one fd and its maxconn
#             (cli.c mworker_cli_sockpair_new, mworker_cli_proxy_new_listener)
#   remain -= 3 * nbthread (an epoll fd and a wake-up pipe per thread)
#   remain -= 2 * pipes when splicing is configured (compute_ideal_maxpipes; left out here: an estimate then)
#   maxconn = max(remain / 2, DEFAULT_MAXCONN)    (two fds per connection: client and server)
# Without `-m` (memmax) that is global.maxconn; each frontend without its own maxconn then takes it
# (proxy_adjust_all_maxconn) and, without `backlog`, listens with it as its backlog (listener_backlog).
RESERVED_FDS, CLI_MAXCONN, DEFAULT_MAXCONN = 10, 10, 100
AT_CAP = "it stops polling its listeners, so new clients wait in the kernel's accept queue"


def sections(lines) -> list[dict]:
    """frontend/listen sections: name, file:line, bound ports and maxconn (own or from `defaults`)."""
    out, defaults_maxconn, defaults_backlog, cur = [], None, False, None
    for ln in lines:
        code = ln.text.split("#", 1)[0]
        words = code.split()
        if not words:
            continue
        if not ln.text[:1].isspace():
            cur = None
            if words[0] in ("frontend", "listen"):
                cur = {"kind": words[0], "name": words[1] if len(words) > 1 else "?", "file": ln.file,
                       "line": ln.number, "ports": [], "maxconn": defaults_maxconn,
                       "own_backlog": defaults_backlog}
                out.append(cur)
                if words[0] == "listen" and len(words) > 2:
                    cur["ports"] += _ports(words[2])
            elif words[0] == "defaults":
                cur = {"kind": "defaults"}
            continue
        if cur is None:
            continue
        if words[0] == "backlog" or (words[0] == "bind" and {"backlog", "maxconn"} & set(words[2:])):
            if cur["kind"] == "defaults":
                defaults_backlog = True
            cur["own_backlog"] = True            # its listeners' backlog is not the maxconn it runs with
        if words[0] == "maxconn" and len(words) > 1 and is_uint(words[1]):
            item = {"value": words[1], "line": ln.number, "file": ln.file}
            if cur["kind"] == "defaults":
                defaults_maxconn = {**item, "from": "defaults"}
            else:
                cur["maxconn"] = item
        elif words[0] == "bind" and len(words) > 1 and cur["kind"] != "defaults":
            cur["ports"] += _ports(words[1])
    return out


def _ports(addr: str) -> list[str]:
    """Ports of a bind address ('*:80', ':8080', '127.0.0.1:80-81,:443')."""
    out = []
    for part in addr.split(","):
        m = re.search(r":([0-9]+)(?:-([0-9]+))?$", part, re.A)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            out += [str(p) for p in range(lo, min(hi, lo + 64) + 1)]
    return out


class RunningHAProxy(Running):
    def config_files(self) -> list[str]:
        return more_config_files(option(self.argv, "-f") or ["/etc/haproxy/haproxy.cfg"])

    def config_arg(self):
        return (self.config_files() or [None])[0]

    def more_configs(self) -> list[str]:
        return self.config_files()[1:]

    def parse(self):
        d = directives(self.lines, ("maxconn", "ulimit-n", "fd-hard-limit", "stats", "nbthread"), section="global")
        if "stats" in d:
            m = re.match(r"socket\s+(\S+)", d["stats"]["value"])
            d["stats socket"] = {**d.pop("stats"), "value": m.group(1)} if m else d.pop("stats")
        if fes := sections(self.lines):
            d["frontends"] = fes
        if self.lines:                      # nothing read (refused, missing): nothing counted from it
            d["fd_users"] = fd_users(self.lines, self.argv)
        return d

    def stats(self):
        path = (self.conf.get("stats socket") or {}).get("value")
        if not path or not path.startswith("/"):
            return {"available": False, "reason": "no `stats socket` in the global section"}
        try:
            data = sockets.unix_query(self.pid, path, b"show info\n", sockets.Deadline(STATS_SECONDS),
                                      self.proc)
        except OSError as e:
            return {"available": False, "reason": f"stats socket {path}: {e.strerror or e}"}
        info = dict(l.split(": ", 1) for l in data.decode(errors="replace").splitlines() if ": " in l)
        keep = ("Maxconn", "Hard_maxconn", "CurrConns", "CumConns", "MaxSock", "Ulimit-n", "ConnRate", "Idle_pct")
        return {"available": True, "source": f"show info on {path}",
                **{k: uint(info[k]) for k in keep if is_uint(info.get(k))}}

    def timing(self):
        return own_clock(self)

    def config_origins(self) -> dict:
        return clock_origins(self.lines)


class HAProxy(Spec, process=RunningHAProxy):
    kind, exe_names = "haproxy", ("haproxy",)
    order = 30
    unit, user, package = "haproxy", "haproxy", "haproxy"
    stores = ("cache",)
    store_design = {"cache": "small objects in shared memory only"}

    @staticmethod
    def launch(store, plan, origin_port, nofile, device=None):
        return HAProxyServer(origin_port, cache_mb=min(plan["cache_mb"], 4095), nofile=nofile)

    @staticmethod
    def time_parts(p: dict) -> dict:
        """What its own clocks show of the window (clock_parts below)."""
        return clock_parts(p)

    @staticmethod
    def caps(ev: dict) -> list[Cap]:
        p, conns = ev["proxy"], ev.get("conns") or {}
        d, conf = p["directives"], p.get("config")
        slack = max(1, p.get("threads") or 1)      # one session per thread may sit between close and accept
        g = global_maxconn(ev)
        limit = g["limit"]
        sessions = [v for v in (peak(p, "CurrConns"), conns.get("clients_peak")) if isinstance(v, int)]
        counted = ("sessions: the larger of `show info` CurrConns and the client sockets it holds on its "
                   "listening ports" if peak(p, "CurrConns") is not None else
                   "sessions: the client sockets it holds on its own listening ports (no stats socket)")
        out = []
        if limit:
            derived = g["derived"]
            out.append(Cap("haproxy-maxconn", "haproxy", "global maxconn" + (" (derived from its fd limit)"
                                                                             if derived else ""),
                           g["named"], limit, g["where"], max(sessions) if sessions else None, counted,
                           max(1, limit - slack), AT_CAP, f"{SOURCE}; {DERIVED_SOURCE}" if derived else SOURCE,
                           derived_fix(g) if derived else
                           f"raise {g['named']} in the global section ({g['where']}), e.g. maxconn 60000, and keep "
                           "the fd limit at 2 x maxconn + reserve (profile linux/haproxy: LimitNOFILE 131072); "
                           "net.core.somaxconn or a longer backlog only lengthens the queue in front of a proxy "
                           "that has stopped accepting", estimate=g["estimate"],
                           extra={"derived_maxconn": g["how"]} if derived else {}))
        for fe in d.get("frontends") or []:
            mc = fe.get("maxconn")
            n = uint((mc or {}).get("value", ""))
            if not n or not fe["ports"] or (limit and n >= limit):
                continue                    # no own cap below the global one: the global cap speaks
            held = sum((conns.get("ports") or {}).get(port, {}).get("clients_peak", 0) for port in fe["ports"])
            at_fe = f"{mc['file'] or conf}:{mc['line']}"
            src = " (from `defaults`)" if mc.get("from") else ""
            out.append(Cap("haproxy-maxconn", "haproxy", f"{fe['kind']} {fe['name']} maxconn{src}",
                           f"maxconn {n}", n, at_fe, held,
                           f"sessions of {fe['kind']} {fe['name']}: client sockets on its ports "
                           f"{', '.join(fe['ports'][:8])}", max(1, n - slack), AT_CAP, SOURCE,
                           f"raise `maxconn {n}` of {fe['kind']} {fe['name']} ({at_fe}) or remove it (the global "
                           "maxconn then applies); somaxconn only lengthens the queue in front of it",
                           ports=tuple(fe["ports"])))
        return out

    @staticmethod
    def fd_fix(p: dict) -> str:
        d, conf = p["directives"], p.get("config")
        ulimit = f"ulimit-n now {d.get('ulimit-n', {}).get('value', 'not set')}; {nofile_now(p)}"
        if "maxconn" not in d:              # it derives maxconn from this limit (compute_ideal_maxconn)
            return (f"haproxy has no maxconn ({where(d, 'maxconn', conf)}) and derives it from this fd limit: set "
                    "maxconn and the fd limit together, `maxconn N` in the global section and an fd limit of at "
                    f"least 2 x N + reserve (profile linux/haproxy: LimitNOFILE 131072) ({ulimit})")
        v = d["maxconn"].get("value")
        return (f"haproxy sizes its fds from `maxconn {v}` ({where(d, 'maxconn', conf)}): keep the hard fd "
                "limit at 2 x maxconn + reserve (profile linux/haproxy: LimitNOFILE 131072); do not set ulimit-n "
                f"below that ({ulimit})")

    @staticmethod
    def backlog_fix(p: dict) -> str:
        return ("haproxy: `backlog 8192` in the frontend (or `bind … backlog 8192`); without it the frontend's "
                "maxconn is its backlog (src/listener.c listener_backlog), capped by net.core.somaxconn")

    @staticmethod
    def port_fix(p: dict) -> str:
        return ("let haproxy reuse server connections: `http-reuse safe` (or `always`) in the backend or "
                "defaults (HAProxy 2.6 default: safe) with `option http-keep-alive`; or give each server its "
                "own source range: `server … source 127.0.0.2:1025-65000` (one address's ports per server)")


def fd_users(lines, argv: list[str]) -> dict:
    """What HAProxy 2.6 adds to global.maxsock from its config and command line before it derives maxconn."""
    stats_sockets, stats_maxconn, checks, splice, peers, master, section = 0, None, 0, False, False, False, None
    for ln in lines:
        words = ln.text.split("#", 1)[0].split()
        if not words:
            continue
        if not ln.text[:1].isspace():
            section = words[0]
            peers = peers or section == "peers"
            continue
        if section == "global" and words[:2] == ["stats", "socket"]:
            stats_sockets += 1
        elif section == "global" and words[:2] == ["stats", "maxconn"] and len(words) > 2:
            stats_maxconn = uint(words[2])
        elif section == "global" and words[0] == "master-worker":
            master = True
        elif words[0] == "server" and section in ("backend", "listen"):
            checks += ("check" in words[2:]) + ("agent-check" in words[2:])
        elif words[0] == "option" and len(words) > 1 and words[1].startswith("splice-"):
            splice = True
    return {"stats_sockets": stats_sockets, "stats_maxconn": stats_maxconn, "checks": checks, "splice": splice,
            "peers": peers, "master_worker": master or any(a in ("-W", "-Ws") for a in argv[1:]),
            "master_cli": len(option(argv, "-S"))}


def computed_maxconn(ev: dict) -> dict | None:
    """HAProxy 2.6's compute_ideal_maxconn() from the evidence (see the comment at RESERVED_FDS): the fd limit,
    the sockets the config reserves, the threads. None without an fd limit."""
    p = ev["proxy"]
    d = p["directives"]
    nofile = [x for x in (p.get("nofile") or [])[:2] if isinstance(x, int)] or \
        [x for pr in (ev.get("procs") or {}).values() for x in (pr.get("nofile_soft"), pr.get("nofile_hard"))
         if isinstance(x, int)]
    if not nofile:
        return None
    fds = max(nofile)
    if (hard := as_int(d, "fd-hard-limit")) is not None and fds > hard:
        fds = hard
    u = d.get("fd_users") or {"stats_sockets": int("stats socket" in d)}      # evidence from before fd_users
    threads = as_int(d, "nbthread") or p.get("threads") or 1
    cli_fe = u.get("stats_sockets") or u.get("master_worker")           # the CLI frontend exists
    reserved = (RESERVED_FDS + len(ev.get("listeners") or []) + u.get("stats_sockets", 0)
                + ((u.get("stats_maxconn") or CLI_MAXCONN) if cli_fe else 0) + u.get("checks", 0)
                + (1 if u.get("master_worker") else 0) + (1 + CLI_MAXCONN) * int(u.get("master_cli") or 0))
    remain = fds - reserved - 3 * threads
    unknown = [w for w, on in (("splice pipes", u.get("splice")), ("peers", u.get("peers"))) if on]
    return {"maxconn": max(remain // 2, DEFAULT_MAXCONN), "fd_limit": fds, "reserved_fds": reserved,
            "threads": threads, "formula": f"({fds} - {reserved} reserved - 3 x {threads} threads) / 2",
            "not_counted": unknown}


def backlog_maxconn(ev: dict) -> int | None:
    """The derived maxconn read back from the kernel: a frontend with no maxconn of its own and no `backlog`
    listens with the global maxconn as its backlog (src/listener.c listener_backlog, after
    proxy_adjust_all_maxconn); the kernel keeps min(backlog, net.core.somaxconn), so a backlog below
    somaxconn (read in the proxy's namespace) is that maxconn exactly."""
    somax = ((ev.get("kernel") or {}).get("sysctl") or {}).get("net.core.somaxconn")
    ports = (ev.get("conns") or {}).get("ports") or {}
    if not isinstance(somax, int):
        return None
    seen = {r.get("backlog") for fe in (ev["proxy"]["directives"].get("frontends") or [])
            if not fe.get("maxconn") and not fe.get("own_backlog") for port in fe["ports"]
            for r in [ports.get(port)] if r}
    seen.discard(None)
    return seen.pop() if len(seen) == 1 and 0 < next(iter(seen)) < somax else None


def global_maxconn(ev: dict) -> dict:
    """The global maxconn: {"limit", "named" (as the fix quotes it), "where", "estimate", "derived",
    "how"}: the written one; else the one HAProxy derived from its fd limit, read from `show info` or from
    its listener's backlog, else computed as HAProxy 2.6 does (an estimate)."""
    p = ev["proxy"]
    d, conf = p["directives"], p.get("config")
    if (v := as_int(d, "maxconn")) is not None:
        return {"limit": v, "named": f"`maxconn {v}`", "where": where(d, "maxconn", conf), "estimate": False,
                "derived": False, "how": None}
    if "maxconn" in d:                  # written but not a number (`maxconn ³`): unknown, not derived
        return {"limit": None, "named": "maxconn", "where": where(d, "maxconn", conf), "estimate": True,
                "derived": False, "how": None}
    computed = computed_maxconn(ev)
    out = {"where": f"{conf} (not set)", "derived": True, "estimate": False}
    if (v := peak(p, "Maxconn")) is not None:
        how = {"read": "show info Maxconn", "computed": computed}
    elif (v := backlog_maxconn(ev)) is not None:
        how = {"read": "its listener's backlog (src/listener.c listener_backlog: a frontend without maxconn or "
                       "backlog listens with the global maxconn)", "computed": computed}
    elif computed:
        v, out["estimate"] = computed["maxconn"], True
        how = {"read": None, "computed": computed}
    else:
        return {"limit": None, "named": "maxconn", "where": "not set", "estimate": True, "derived": True, "how": None}
    fds = f" {computed['fd_limit']}" if computed else ""
    return {**out, "limit": v, "how": how,
            "named": f"maxconn (not set: haproxy derived {'about ' if out['estimate'] else ''}{v} from its fd limit{fds})"}


def derived_fix(g: dict) -> str:
    """The fix of a maxconn HAProxy derived: the fd limit is the cap, so both move together."""
    fds = ((g.get("how") or {}).get("computed") or {}).get("fd_limit")
    limit_now = f" (now {fds})" if fds else ""
    return (f"set maxconn and the fd limit together: haproxy has no maxconn in its global section ({g['where']}) "
            f"and derived {g['limit']} from its fd limit{limit_now}, two fds per connection; write `maxconn N` in "
            "the global section, e.g. maxconn 60000, and start it with an fd limit of at least 2 x N + reserve "
            "(profile linux/haproxy: LimitNOFILE 131072); net.core.somaxconn or a longer backlog only lengthens "
            "the queue in front of a proxy that has stopped accepting")


def more_config_files(argv_paths: list[str]) -> list[str]:
    """-f arguments that name a directory stand for its *.cfg files, in name order."""
    out = []
    for path in argv_paths:
        if path.startswith("/") and os.path.isdir(path):
            out += sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".cfg"))
        else:
            out.append(path)
    return out


# ---------------------------------------------------------------- its own clocks (issue 28)
#
# HAProxy's own clocks: `show stat` on its stats socket, read when the
# doctor's window starts and ends, and its queue lengths sampled in between.
#
# What the figures are (haproxy 2.6 src/stream.c stream_update_time_stats,
# called when a stream ends): for each request that got a server connection
# and a response (t_connect and t_data set; a failed request adds nothing),
# qtime = time in the backend's or server's queue, ctime = time to connect
# to the server, rtime = from the connection to the response headers (the
# origin's first byte, as haproxy saw it), ttime = the whole stream. Each is
# kept per backend and per server as a sliding mean: the sum of the values
# while the counter cum_req (req_tot) is at most TIME_STATS_SAMPLES = 1024,
# then sum += v - sum/1024 (include/haproxy/freq_ctr.h swrate_add_dynamic),
# shown as sum / min(cum_req, 1024) in whole ms (src/stats.c). Both
# readings together give the mean of the requests in the window (see
# window_mean): exact arithmetic, not an assumption about the load.
#
# ttime is not the request's time: on a keep-alive connection the stream's
# clock starts when the previous request ended (src/mux_h1.c h1_detach resets
# sess->tv_accept), so it holds the client's pause between requests. The
# proxy's own total is qtime + ctime + rtime instead (the request's receipt
# and the body's transfer are left out).
#
# Requests queue only behind a server's `maxconn` (or when every server is
# full or down: the backend's queue): src/queue.c pendconn_add, configuration
# manual 5.2 "maxconn"; qcur is each queue's length now (a gauge), qmax its
# peak since start.

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


def own_clock(proxy) -> Window:
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


def clock_parts(p: dict) -> dict:
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
                population="requests that went to a server", by_origin=by, uncertainty_ms=worst)


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
                cause=_cause(samples, servers, conf), check=check, uncertainty_ms=worst)


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
                samples=got[0]["samples"], requests=got[0]["requests"], population="requests that reached a backend",
                uncertainty_ms=sum(g.get("uncertainty_ms") or 0 for g in got))


def clock_origins(lines) -> dict:
    out = {}
    for s in server_lines(lines):
        addr = split_address(s["addr"])
        if addr:
            out.setdefault(addr, {"name": f"backend {s['backend']}, server {s['server']}",
                                  "where": f"{s['file']}:{s['line']}"})
    return out


class HAProxyServer(Server):
    """haproxy -db (foreground) with a global maxconn, a stats socket, and its cache (max_mb > 0)."""

    def __init__(self, origin_port: int, maxconn: int | None = 4096, cache_mb: int = 64, nofile: tuple | None = None,
                 bind: str = "", stats_socket: bool = True, frontend_maxconn: int | None = None,
                 server_maxconn: int | None = None, verbose: bool = False):
        self.exe = need("haproxy", HAProxy.package)
        self.dir, self.port, self.nofile = tempdir("haproxy"), free_port(), nofile
        self.verbose = verbose              # -V: it says at start the maxconn it derived (said_maxconn)
        self.stats_socket = self.dir / "stats.sock"
        cache = (f"cache c\n    total-max-size {cache_mb}\n    max-object-size 1048576\n    max-age 86400\n"
                 if cache_mb else "")
        use = ("    http-request cache-use c\n    http-response cache-store c\n"
               "    http-response set-header X-Cache HIT if { res.cache_hit }\n" if cache_mb else "")
        # maxconn None: haproxy derives it from the fd limit it starts with (configuration.txt 3.2 "maxconn")
        cap = f"    maxconn {maxconn}\n" if maxconn else ""
        (self.dir / "haproxy.cfg").write_text(
            f"global\n{cap}"
            + (f"    stats socket {self.stats_socket} mode 600 level admin\n" if stats_socket else "") +
            f"    pidfile {self.dir}/haproxy.pid\n{cache}"
            # HAProxy builds a resolvers section "default" from /etc/resolv.conf unless one of that name is
            # declared (configuration.txt 5.3.2 "The resolvers section"): ours asks loopback only
            f"resolvers default\n    nameserver dead {dead_resolver()}\n"
            # idle keep-alive clients are held 2 minutes, as Squid and Traffic Server do (the client timeout
            # would otherwise close them after 30 s)
            "defaults\n    mode http\n    timeout connect 5s\n    timeout client 120s\n    timeout server 30s\n"
            "    timeout http-keep-alive 120s\n"
            f"frontend fe\n    bind 127.0.0.1:{self.port}{' ' + bind if bind else ''}\n"
            + (f"    maxconn {frontend_maxconn}\n" if frontend_maxconn else "") +
            f"{use}    default_backend origin\n"
            # server_maxconn: requests beyond it wait in haproxy's queue (configuration.txt 5.2 "maxconn")
            f"backend origin\n    server o 127.0.0.1:{origin_port}"
            + (f" maxconn {server_maxconn}" if server_maxconn else "") + "\n")

    @property
    def conf(self) -> Path:
        return self.dir / "haproxy.cfg"

    def __enter__(self):
        argv = [self.exe, "-db", *(["-V"] if self.verbose else []), "-f", str(self.conf)]
        self._launch(limited(argv, self.nofile), stderr=self.dir / "stderr.log" if self.verbose else None)
        return self

    def said_maxconn(self) -> int | None:
        """The maxconn haproxy -V said it set at start ("Note: setting global.maxconn to N.", src/haproxy.c
        init() when none is written), else None."""
        try:
            m = re.search(r"setting global\.maxconn to ([0-9]+)", (self.dir / "stderr.log").read_text(), re.A)
        except OSError:
            return None
        return int(m.group(1)) if m else None

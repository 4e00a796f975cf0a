"""Apache Traffic Server: traffic_server with its runroot layout, records.config,
the stats_over_http plugin's /_stats, diags.log, and its connection throttle.

How it counts and refuses (iocore/net/P_UnixNet.h net_connections_to_throttle,
check_net_throttle; records.config proxy.config.net.connections_throttle):
the throttle counts client and origin connections together, and accepting
keeps 10% headroom (NET_THROTTLE_ACCEPT_HEADROOM 1.1: open x 1.1 >=
throttle, so at about 91% of it); there new client connections
are accepted and reset, "too many connections, throttling" goes to
diags.log at most every few minutes, and connections_throttled_in counts
them. Its own gauge (connections_currently_open) can read 0 under load,
so the sockets it holds (connsample) count too.
"""

import contextlib
import datetime
import json
import math
import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

from proxytune.core import procfs, targetread
from proxytune.core.numbers import is_uint

from .base import LOG_TAIL, Running, Spec, as_int, delta, nofile_now, option, peak, read_config, where
from .timing import (MAX_VALUES, Unavailable, Window, address, answer, decimal, digest, nothing, origin_entry,
                     parse_line, part, split_address, spread, template_regex, timed_lines, unmeasurable)
from .cap import Cap
from .launch import Server, dead_resolver, free_port, limited, need, tempdir

THROTTLE = "proxy.config.net.connections_throttle"
SOURCE = ("trafficserver iocore/net/P_UnixNet.h check_net_throttle (NET_THROTTLE_ACCEPT_HEADROOM 1.1); "
          "records.config connections_throttle")
ACCEPT_HEADROOM = 1.1


class RunningTrafficServer(Running):
    def layout(self, name: str, default: str) -> str:
        """A directory of the runroot the command line names (--run-root=FILE), else Debian's."""
        root = (option(self.argv, "--run-root") or [None])[0]
        if root:
            text = read_config(self.pid, root, self.proc).text
            m = re.search(rf"^{name}:\s*(/\S+)", text or "", re.M)
            if m:
                return m.group(1)
        return default

    def config_dir(self) -> str:
        return self.layout("sysconfdir", "/etc/trafficserver")

    def throttle_warnings(self) -> dict:
        """'too many connections, throttling' lines in diags.log logged since this traffic_server started
        (older ones belong to an earlier run), with the connection count the last one gives. ATS logs it
        at most once every few minutes, so a short window may see none new while it still throttles."""
        text = targetread.read(self.pid, str(Path(self.layout("logdir", "/var/log/trafficserver")) / "diags.log"),
                               start=-LOG_TAIL, proc=self.proc).text
        since = procfs.started_at(self.pid)
        lines = [ln for ln in (text or "").splitlines() if "too many connections, throttling" in ln
                 and (since is None or (logged_at(ln) or since) >= since - 1)]
        last = re.search(r"current_connections=([0-9]+)", lines[-1], re.A) if lines else None
        return {"throttle_warnings": len(lines), "throttled_at_connections": int(last.group(1)) if last else None}

    def config_arg(self):
        return str(Path(self.config_dir()) / "records.config")

    def parse(self):
        out = {}
        for ln in self.lines:
            w = ln.text.split()
            if len(w) >= 4 and w[0] in ("CONFIG", "LOCAL") and w[1] in (
                    THROTTLE, "proxy.config.net.max_connections_in", "proxy.config.http.server_ports",
                    "proxy.config.http.server_session_sharing.match"):
                out[w[1]] = {"value": " ".join(w[3:]), "line": ln.number, "file": ln.file}
        out.setdefault(THROTTLE, {"value": "30000", "line": None, "where": "Traffic Server default"})
        plugins = read_config(self.pid, str(Path(self.config_dir()) / "plugin.config"), self.proc).text
        out["stats_over_http"] = {"value": "on" if re.search(r"^\s*stats_over_http", plugins or "", re.M) else "off",
                                  "line": None}
        return out

    def stats(self):
        warned = self.throttle_warnings()
        ports = re.findall(r"^[0-9]+", (self.conf.get("proxy.config.http.server_ports") or {}).get("value", "8080"),
                           re.A)
        if self.conf["stats_over_http"]["value"] != "on" or not ports:
            return {"available": False, "reason": "the stats_over_http plugin is not in plugin.config", **warned}
        try:
            g = json.loads(self.status_page(f"127.0.0.1:{ports[0]}", "/_stats"))
            g = g.get("global") if isinstance(g, dict) and isinstance(g.get("global"), dict) else {}
        except (OSError, ValueError) as e:
            return {"available": False, "reason": f"/_stats: {e}", **warned}
        keep = ("proxy.process.net.connections_currently_open", "proxy.process.net.connections_throttled_in",
                "proxy.process.http.current_client_connections", "proxy.process.http.total_client_connections")
        from proxytune.core.numbers import uint
        return {"available": True, "source": f"stats_over_http 127.0.0.1:{ports[0]}/_stats", **warned,
                **{k.rsplit(".", 1)[1]: n for k in keep if (n := uint(str(g.get(k)))) is not None}}

    def timing(self):
        return own_clock(self)

    def config_origins(self) -> dict:
        return clock_origins(self)


class TrafficServer(Spec, process=RunningTrafficServer):
    kind, exe_names = "trafficserver", ("traffic_server",)
    order = 50
    unit, user, package = "trafficserver", "trafficserver", "trafficserver"
    managers = ("traffic_manager",)             # Debian's unit runs traffic_manager, which starts traffic_server
    stores = ("file", "raw")
    store_design = {"file": "one large file: its own directory, aggregated writes",
                    "raw": "a raw block device: the same layout with no filesystem"}
    device_stores = ("raw",)
    hit_ratio_from = "traffic_server /_stats"

    @staticmethod
    @contextlib.contextmanager
    def launch(store, plan, origin_port, nofile, device=None):
        """The raw store on the block device it is given (microbench makes a loop device for it)."""
        args = {"raw_device": device} if store == "raw" else {"cache_mb": plan["cache_mb"]}
        with ATSServer(origin_port, nofile=nofile, **args) as s:
            yield s

    @staticmethod
    def counters(server) -> dict:
        return stats_hits(stats_over_http(server.port))

    @staticmethod
    def time_parts(p: dict) -> dict:
        """What its own clocks show of the window (clock_parts below)."""
        return clock_parts(p)

    @staticmethod
    def caps(ev: dict) -> list[Cap]:
        p, conns = ev["proxy"], ev.get("conns") or {}
        d, conf = p["directives"], p.get("config")
        cap = as_int(d, THROTTLE)
        if not cap:
            return []
        held = (conns.get("clients_peak") or 0) + (conns.get("upstream_peak") or 0) if conns else None
        counted = [v for v in (peak(p, "connections_currently_open"), held,
                               (ev.get("connections") or {}).get("total")) if isinstance(v, int)]
        after = p.get("stats_after") or {}
        throttled = delta(p, "connections_throttled_in")
        if throttled is None:             # at the cap it reset our first /_stats: the count since its start
            throttled = after.get("connections_throttled_in")
        reset = int(not after.get("available") and after.get("throttle_warnings", 0) > 0)  # it refused /_stats
        w = where(d, THROTTLE, conf)
        return [Cap("trafficserver-connections-throttle", "traffic_server", "connections_throttle",
                    f"CONFIG {THROTTLE} INT {cap}", cap, w, max(counted) if counted else None,
                    "client and origin connections: the larger of its gauge and the sockets it holds",
                    math.ceil(cap / ACCEPT_HEADROOM), "it accepts and resets new connections (\"too many connections, throttling\")", SOURCE,
                    f"raise `CONFIG {THROTTLE} INT {cap}` in {w} (default 30000) and the fd limit above 2 x it "
                    "(profile linux/trafficserver: LimitNOFILE 65536); then traffic_ctl config reload or restart",
                    refused={"connections_throttled_in": throttled or 0,
                             "throttle_warnings_in_window": delta(p, "throttle_warnings") or 0,
                             "throttle_warnings_since_start": after.get("throttle_warnings") or 0,
                             "stats_refused": reset},
                    extra={"throttled_at_connections": after.get("throttled_at_connections"),
                           "stats": after.get("source") or after.get("reason")})]

    @staticmethod
    def fd_fix(p: dict) -> str:
        d = p["directives"]
        return ("raise trafficserver's LimitNOFILE (profile linux/trafficserver: 65536) above 2 x "
                f"connections_throttle ({d.get(THROTTLE, {}).get('value')}); "
                f"proxy.config.system.file_max_pct caps what it uses of fs.file-max; {nofile_now(p)}")

    @staticmethod
    def backlog_fix(p: dict) -> str:
        return ("trafficserver: `CONFIG proxy.config.net.listen_backlog INT 8192` in records.config (default -1: "
                "net.core.somaxconn), capped by net.core.somaxconn")

    @staticmethod
    def port_fix(p: dict) -> str:
        d, conf = p["directives"], p.get("config")
        name = "proxy.config.http.server_session_sharing.match"
        return (f"share origin sessions: `CONFIG {name} STRING both` (now "
                f"{d.get(name, {}).get('value', 'default both')}, {where(d, name, conf)}) with "
                "proxy.config.http.keep_alive_enabled_out 1, so connections to the origin are reused")


def logged_at(line: str) -> float | None:
    """The time of a diags.log line ('[Nov 23 11:44:06.895] ...'), which has no year: this year's,
    or last year's when that would lie in the future."""
    m = re.match(r"\[([A-Za-z]{3} +[0-9]+ [0-9]{2}:[0-9]{2}:[0-9]{2})", line)
    if not m:
        return None
    now = datetime.datetime.now()
    try:
        t = datetime.datetime.strptime(f"{now.year} {m.group(1)}", "%Y %b %d %H:%M:%S")
    except ValueError:
        return None
    if t > now + datetime.timedelta(days=1):
        t = t.replace(year=now.year - 1)
    return t.timestamp()


def stats_over_http(port: int) -> dict:
    """Traffic Server's counters from the stats_over_http plugin (values are strings)."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stats", timeout=10) as r:
        # stats_over_http has once answered with a stray non-UTF-8 byte (a CI run): read it as text
        return json.loads(r.read().decode("utf-8", "replace")).get("global", {})


def stats_hits(g: dict) -> dict:
    num = lambda k: int(float(g.get(k, 0) or 0))
    hits = sum(num(k) for k in g if k.startswith("proxy.process.http.cache_hit_") and "_mem_" not in k)
    misses = sum(num(k) for k in g if k.startswith("proxy.process.http.cache_miss_"))
    return {"hits": hits, "misses": misses}


# ---------------------------------------------------------------- its own clocks (issue 28)
#
# Traffic Server's own clocks: its transaction milestones, as its ASCII
# access log carries them (the lines appended in the window) and as the
# stats_over_http plugin sums them.
#
# Milestones (trafficserver 9.2 proxy/Milestones.h; marked in
# proxy/http/HttpSM.cc): SM_START (the transaction's state machine starts:
# its request's first bytes), SERVER_FIRST_CONNECT and SERVER_CONNECT (the
# first and the last time do_http_server_open ran: a request held by the
# per-origin connection cap is rescheduled every
# proxy.config.http.per_server.connection.queue_delay ms and runs it again),
# SERVER_CONNECT_END (connected, or a pooled session attached),
# SERVER_BEGIN_WRITE (request written), SERVER_FIRST_READ (the origin's first
# byte), SM_FINISH. A log field `%<{A-B}msdms>` is A - B in ms, and -1 when A
# was never reached (Milestones::difference_msec's `missing`): a cache hit
# never reaches SERVER_FIRST_READ, so its -1 is no time and is left out. So:
# proxy_queue = SERVER_CONNECT - SERVER_FIRST_CONNECT, origin_connect =
# SERVER_CONNECT_END - SERVER_CONNECT, origin_first_byte = SERVER_FIRST_READ -
# SERVER_BEGIN_WRITE; %<ttms> is SM_START to SM_FINISH.
#
# The per-origin queue (proxy/http/HttpSM.cc do_http_server_open, 9.2):
# with proxy.config.http.per_server.connection.max connections open to an
# origin, a transaction waits when queue_size is -1 (no limit) or has room,
# and gets 502 "origin throttled" otherwise (queue_size 0: always).
#
# proxy.process.http.milestone.X (proxy/http/HttpTransact.cc
# update_size_and_time_stats) sums X - SM_START over finished transactions
# (an unreached one adds 0 there); the plugin shows them as last synced from
# the threads, every proxy.config.raw_stat_sync_interval_ms (5000 by default:
# lib/records/P_RecDefs.h), so a short window may see no sync at all: the
# stats are then no figure. ATS buffers log lines too: a line is written up
# to proxy.config.log.max_secs_per_buffer (5 s by default) after its
# transaction, so at the window's end the log holds few of the window's own
# transactions; the transactions that ended in an interval as long as the
# window, one flush interval earlier, are read instead (the log's tail, by
# %<cqtq> + %<ttms>): all of them are written by then, short or long.

CAP = "proxy.config.http.per_server.connection"
FLUSH = "proxy.config.log.max_secs_per_buffer"
TAIL = 2 << 20                  # the log's last bytes read at the window's end
DIFFS = {"proxy_queue": ("SERVER_CONNECT", "SERVER_FIRST_CONNECT"),
         "origin_connect": ("SERVER_CONNECT_END", "SERVER_CONNECT"),
         "origin_first_byte": ("SERVER_FIRST_READ", "SERVER_BEGIN_WRITE")}
STATS = ("completed_requests", "outgoing_requests", "origin_connections_throttled_out",
         *(f"milestone.{m}" for m in ("sm_finish", "server_first_connect", "server_connect", "server_connect_end",
                                      "server_begin_write", "server_first_read")))
FIELD = re.compile(r"%<([^>]{1,96})>")
MECH = "trafficserver transaction milestones (proxy/Milestones.h)"


def logging_yaml(text: str) -> tuple[dict, list[dict]]:
    """formats (name -> format) and logs ({filename, format, mode}) of a logging.yaml, read line by
    line: the plain shape of ATS's own file (`- name:` / `format:` items, quoted or `|-` scalars)."""
    items: dict[str, list[dict]] = {"formats": [], "logs": []}
    section, item, block = None, None, None
    for raw in text.splitlines()[:4000]:
        line = raw.split(" #", 1)[0].rstrip()
        indent = len(line) - len(line.lstrip())
        if block is not None and line.strip() and indent > block[1]:
            item[block[0]] = (item.get(block[0], "") + " " + line.strip()).strip()
            continue
        block = None
        m = re.match(r"(- )?([A-Za-z_]+):\s*(.*)$", line.strip())
        if not m:
            continue
        if m.group(2) in items and not m.group(1) and not m.group(3):
            section, item = m.group(2), None
            continue
        if section is None:
            continue
        if m.group(1):
            item = {}
            items[section].append(item)
        if item is None:
            continue
        if m.group(3) in ("|", "|-", ">", ">-"):
            block = (m.group(2), indent)
        else:
            item[m.group(2)] = m.group(3).strip().strip("'\"")
    formats = {f["name"]: f["format"] for f in items["formats"] if "name" in f and "format" in f}
    return formats, items["logs"]


def tokens(fmt: str) -> list[tuple[str, str]]:
    out, i = [], 0
    for m in FIELD.finditer(fmt):
        if m.start() > i:
            out.append(("lit", fmt[i:m.start()]))
        out.append(("field", m.group(1)))
        i = m.end()
    if i < len(fmt):
        out.append(("lit", fmt[i:]))
    return out


def milestone_fields(fmt: str) -> dict:
    """part -> the msdms field of the format that measures it (either spelling: TS_MILESTONE_X or X)."""
    out = {}
    for field in (m.group(1) for m in FIELD.finditer(fmt)):
        d = re.fullmatch(r"\{(?:TS_MILESTONE_)?([A-Z_]+)-(?:TS_MILESTONE_)?([A-Z_]+)\}msdms", field)
        if d:
            for part_name, pair in DIFFS.items():
                if (d.group(1), d.group(2)) == pair:
                    out[part_name] = field
    return out


def access_log(proxy) -> dict | None:
    """The first ASCII log of logging.yaml (path, format text, where), or why there is none."""
    path = str(Path(proxy.config_dir()) / "logging.yaml")
    got = read_config(proxy.pid, path, proxy.proc)
    if got.text is None:
        return {"why": f"{path}: {got.why}"}
    formats, logs = logging_yaml(got.text)
    for log in logs:
        name = log.get("filename") or ""
        if log.get("mode") != "ascii" or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            continue
        fmt = formats.get(log.get("format") or "")
        if fmt:
            file = name if name.endswith(".log") else f"{name}.log"
            return {"path": str(Path(proxy.layout("logdir", "/var/log/trafficserver")) / file),
                    "format": log["format"], "text": fmt, "where": path}
    return {"why": f"{path} has no ASCII log (a binary log needs traffic_logcat)"}


def records(lines) -> dict:
    """The per-origin connection cap's records and the log's flush interval, with file:line."""
    out = {}
    for ln in lines:
        w = ln.text.split()
        if len(w) >= 4 and w[0] in ("CONFIG", "LOCAL") and (w[1].startswith(CAP + ".") or w[1] == FLUSH):
            out[w[1].rsplit(".", 1)[1]] = {"value": w[3], "where": f"{ln.file}:{ln.number}",
                                           "text": " ".join(w[:4])}
    return out


def flush_lag(rec: dict) -> int:
    """How old a transaction's line can be when ATS writes it: max_secs_per_buffer (default 5 s), + 1."""
    v = (rec.get("max_secs_per_buffer") or {}).get("value", "5")
    return (int(v) if is_uint(v) else 5) + 1


def recent(text: str, fmt: str, since: float, until: float) -> str:
    """The lines of a log tail whose transaction ended in [since, until) (epoch s: %<cqtq> or %<cqts>, its
    start, + %<ttms>; without %<ttms>, those that started then). Every transaction that ended a flush
    interval ago has been written, whatever it waited, so the pick is not biased to short ones. A tail's
    first line may be cut: it does not parse and is dropped."""
    lf = template_regex(tokens(fmt))
    stamp = next((k for k in ("cqtq", "cqts") if lf and k in lf.groups), None)
    if stamp is None:
        return ""
    keep = []
    for line in text.splitlines()[-MAX_VALUES:]:
        f = parse_line(lf, line)
        t = decimal(f.get(stamp)) if f else None
        took = decimal(f.get("ttms")) if f else None
        end = t + took / 1000 if t is not None and took is not None and took >= 0 else t
        if end is not None and since <= end < until:
            keep.append(line)
    return "\n".join(keep)


class Clock(Window):
    def __init__(self, proxy, log: dict):
        super().__init__(proxy)
        self.log = log
        self.source = " and ".join(x for x in (log.get("path") and f"{log['path']} (format {log['format']})",
                                               proxy.conf["stats_over_http"]["value"] == "on" and "/_stats")
                                   if x) or "none"

    def begin(self):
        self.data["records"] = records(self.proxy.lines)
        self.data["log"] = {k: v for k, v in self.log.items() if k != "text"}
        self.wall = time.time()
        self.data["stats_start"] = self._stats()

    def end(self):
        """ATS writes a transaction's line up to max_secs_per_buffer after it ended, so the window's own
        transactions are mostly not written yet: the transactions that ended in an interval as long as the
        window, one flush interval earlier, stand for it (a steady load's recent past)."""
        self.data["stats_end"] = self._stats()
        if not self.log.get("path"):
            return
        lag = flush_lag(self.data["records"])
        tail = targetread.read(self.proxy.pid, self.log["path"], start=-TAIL, proc=self.proxy.proc).text or ""
        self.data["log"]["shifted_back_s"] = lag
        self.data["lines"] = read_lines(recent(tail, self.log["text"], self.wall - lag,
                                               self.wall - lag + (self.t1 - self.t0)), self.log["text"])

    def _stats(self) -> dict | None:
        if self.proxy.conf["stats_over_http"]["value"] != "on":
            return None
        ports = re.findall(r"^[0-9]+", (self.proxy.conf.get("proxy.config.http.server_ports") or {})
                           .get("value", "8080"), re.A)
        try:
            g = json.loads(self.proxy.status_page(f"127.0.0.1:{ports[0]}", "/_stats")).get("global")
        except (OSError, ValueError, IndexError, AttributeError):
            return None
        g = g if isinstance(g, dict) else {}
        return {k: int(v) for k in STATS if isinstance(v := g.get(f"proxy.process.http.{k}"), str)
                and is_uint(v)}


def read_lines(text: str, fmt: str) -> dict:
    lf = template_regex(tokens(fmt))
    if lf is None:
        return {"understood": False}
    diffs = milestone_fields(fmt)
    got, unread = timed_lines(text, lf, "ttms")
    total, by = [tt for _, tt in got], {}
    parts_seen = {p: [] for p in diffs}
    for f, _ in got:
        origin = _origin(f)
        for p, field in diffs.items():
            v = decimal(f.get(field))
            if v is not None and v >= 0:        # -1: the milestone was not reached (a hit: no origin)
                parts_seen[p].append(v)
                if origin:
                    by.setdefault(origin, {}).setdefault(p, []).append(v)
    waited = sum(1 for v in parts_seen.get("proxy_queue", []) if v > 0)
    return {"understood": True, "fields": sorted(diffs), "requests": len(total), "unread": unread, "waited": waited,
            "total": spread(total), "parts": {p: digest(v) for p, v in parts_seen.items()},
            "origins": {o: {p: digest(v) for p, v in d.items()} for o, d in list(by.items())[:64]}}


def _origin(f: dict) -> str | None:
    host = next((f[k] for k in ("nhi", "shi", "shn") if f.get(k) not in (None, "", "-", "0")), None)
    if not host or len(host) > 64:
        return None
    port = f.get("nhp") if is_uint(f.get("nhp") or "") and f.get("nhp") != "0" else None
    if not port:
        url = next((f[k] for k in ("pquc", "cquc", "cquuc") if (f.get(k) or "").startswith("http")), "")
        try:
            port = str(urlsplit(url).port or "")
        except ValueError:
            port = ""
    return f"{host}:{port}" if port else host



def own_clock(proxy) -> Window:
    log = access_log(proxy)
    if log.get("why") and proxy.conf["stats_over_http"]["value"] != "on":
        return Unavailable(proxy, f"{log['why']}, and stats_over_http is not loaded: no milestone is readable")
    return Clock(proxy, log)


# ---------------------------------------------------------------- pure

def clock_parts(p: dict) -> dict:
    t = p.get("timing") or {}
    if not t.get("available"):
        return nothing(t.get("reason") or "traffic server's milestones were not read in this window", MECH)
    lines, log = t.get("lines") or {}, t.get("log") or {}
    named = f"{log.get('path')} (format {log.get('format')})" if log.get("path") else None
    n = lines.get("requests") or 0
    total = None
    if n:
        tot = lines["total"]
        total = part(tot["mean"], f"{MECH}: %<ttms>, SM_START to SM_FINISH", _span_text(log, named), samples=n,
                     requests=n, p50=tot["p50"], p99=tot["p99"])
    out = {}
    for name, (a, b) in DIFFS.items():
        got = _from_log(lines, log, name, named) if n and name in lines.get("fields", []) else None
        out[name] = got or _from_stats(t, a, b)
    total = total or _from_stats(t, "SM_FINISH", "SM_START")
    cause = _cause(t)
    if cause and out["proxy_queue"].get("measurable"):
        out["proxy_queue"]["cause"] = cause
    elif not cause:
        out["proxy_queue"] = unmeasurable(f"Traffic Server queues a request only at {CAP}.max, which is not set "
                                          "(records.config): it has no queue here", MECH)
    source = (f"transactions of {log.get('path')} that ended in a window as long as this one, "
              f"{log.get('shifted_back_s')} s earlier" if n else "none counted")
    return answer(out, total, n or None, source)


def _span_text(log: dict, named: str) -> str:
    return (f"whole ms; the transactions of {named} that ended in an interval as long as the window, "
            f"{log.get('shifted_back_s')} s before it (ATS writes a line up to proxy.config.log.max_secs_per_buffer "
            "after its transaction)")


def _from_log(lines: dict, log: dict, name: str, named: str) -> dict:
    a, b = DIFFS[name]
    d = lines["parts"][name]
    if not d["n"]:
        return unmeasurable(f"no transaction of the window reached {a} (all from the cache)", MECH)
    by = {(split_address(o) or o): origin_entry(o, None, v[name]["sum_ms"] / v[name]["n"], v[name]["n"])
          for o, v in (lines.get("origins") or {}).items() if (v.get(name) or {}).get("n")}
    return part(d["sum_ms"] / d["n"], f"{MECH}: %<{{{a}-{b}}}msdms> in {named}",
                _span_text(log, named) + "; -1 (not reached) left out",
                samples=d["n"], requests=d["n"], population=f"transactions that reached {a}", by_origin=by,
                p50=d["p50"], p99=d["p99"])


def _from_stats(t: dict, a: str, b: str) -> dict:
    """A milestone difference's mean from the plugin's sums; an unreached milestone adds 0 there, so the
    mean is over every finished transaction (the population says so)."""
    s0, s1 = t.get("stats_start") or {}, t.get("stats_end") or {}
    if not s0 or not s1:
        return unmeasurable("neither the access log's format nor stats_over_http gives this milestone", MECH)
    keys = [f"milestone.{a.lower()}", f"milestone.{b.lower()}" if b != "SM_START" else None, "completed_requests"]
    if any(k and (k not in s0 or k not in s1) for k in keys):
        return unmeasurable("stats_over_http does not show the milestone sums", MECH)
    done = s1["completed_requests"] - s0["completed_requests"]
    if done <= 0:
        return unmeasurable("no sync of ATS's raw stats in the window (proxy.config.raw_stat_sync_interval_ms, "
                            "5 s by default): the sums did not move", MECH)
    grew = (s1[keys[0]] - s0[keys[0]]) - ((s1[keys[1]] - s0[keys[1]]) if keys[1] else 0)
    return part(max(0.0, grew / done), f"{MECH}: stats_over_http proxy.process.http.milestone.{a.lower()}"
                + (f" - {b.lower()}" if keys[1] else "") + " (sums of X - SM_START, HttpTransact.cc)",
                f"mean of the {done} transactions between two syncs of its raw stats (not exactly the window)",
                samples=done, requests=done, population="every transaction (one that never reached a milestone "
                                                        "adds 0)")


def _cause(t: dict) -> dict | None:
    rec = t.get("records") or {}
    mx = rec.get("max") or {}
    if not is_uint(mx.get("value") or "0") or int(mx.get("value") or 0) <= 0:
        return None
    qs = (rec.get("queue_size") or {}).get("value", "0 (default)")
    s0, s1 = t.get("stats_start") or {}, t.get("stats_end") or {}
    throttled = (s1.get("origin_connections_throttled_out", 0) - s0.get("origin_connections_throttled_out", 0)
                 if s0 and s1 else None)
    lines = t.get("lines") or {}
    window = t.get("window_s") or 0
    waits = (lines.get("parts") or {}).get("proxy_queue") or {}
    return {"what": "the per-origin connection queue", "directive": f"{mx.get('text')} (queue_size {qs}, queue_delay "
                         f"{(rec.get('queue_delay') or {}).get('value', '100 (default)')} ms)",
            "where": mx.get("where"), "limit": int(mx["value"]), "queue_now": None, "queue_max": None,
            # ATS shows no queue length: the transactions of the window that waited, and Little's law on their waits
            "waited": lines.get("waited") if "proxy_queue" in lines.get("fields", []) else None,
            "queue_mean": round(waits["sum_ms"] / 1000 / window, 2) if waits.get("n") and window else None,
            "throttled_in_window": throttled}


def clock_origins(proxy) -> dict:
    """remap.config `map FROM http://IP:PORT/...` targets (a forward proxy has none)."""
    path = str(Path(proxy.config_dir()) / "remap.config")
    text = read_config(proxy.pid, path, proxy.proc).text or ""
    out = {}
    for n, line in enumerate(text.splitlines()[:5000], 1):
        w = line.split("#", 1)[0].split()
        if len(w) >= 3 and w[0] in ("map", "reverse_map", "map_with_referer", "regex_map"):
            try:
                u = urlsplit(w[2])
                addr = address(u.hostname or "", u.port or (443 if u.scheme == "https" else 80))
            except ValueError:
                addr = None
            if addr:
                out.setdefault(addr, {"name": f"{w[0]} {w[1][:80]}", "where": f"{path}:{n}"})
    return out


TS_LOG_FORMAT = "%<cqtq> %<ttms> %<chi> %<crc>/%<pssc> %<psql> %<cqhm> %<cquc> %<caun> %<phr>/%<shn> %<psct>"


class ATSServer(Server):
    """traffic_server (no traffic_manager) from a runroot in a temp dir: records.config, a cache on
    one large file in the temp dir or on a raw block device, a Squid-format ASCII access log and
    the stats_over_http plugin (/_stats) for its own counters."""

    def __init__(self, origin_port: int | None = None, cache_mb: int = 256, raw_device: str | None = None,
                 throttle: int | None = None, records: dict | None = None, nofile: tuple | None = None,
                 stats_plugin: bool = True, remap_to: int | None = None, log_format: str = TS_LOG_FORMAT):
        self.exe = need("traffic_server", TrafficServer.package)
        self.dir, self.port = tempdir("trafficserver", "trafficserver"), free_port()
        self.grace, self.nofile = 15, nofile
        for sub in ("etc", "cache", "log", "run"):
            (self.dir / sub).mkdir()
        etc = self.dir / "etc"
        shutil.copytree("/etc/trafficserver/body_factory", etc / "body_factory")
        (self.dir / "runroot.yaml").write_text("".join(f"{k}: {v}\n" for k, v in {
            "prefix": self.dir, "exec_prefix": "/usr", "bindir": "/usr/bin", "sbindir": "/usr/sbin",
            "sysconfdir": etc, "datadir": self.dir / "cache", "includedir": "/usr/include",
            "libdir": "/usr/lib/trafficserver", "libexecdir": "/usr/lib/trafficserver/modules",
            "localstatedir": self.dir / "run", "runtimedir": self.dir / "run", "logdir": self.dir / "log",
            "cachedir": self.dir / "cache"}.items()))
        rec = {"proxy.config.http.server_ports": ("STRING", str(self.port)),
               "proxy.config.url_remap.remap_required": ("INT", 0),
               "proxy.config.admin.user_id": ("STRING", "trafficserver"),
               "proxy.config.http.cache.http": ("INT", 1),
               "proxy.config.http.insert_response_via_str": ("INT", 0),
               "proxy.config.log.logging_enabled": ("INT", 3),
               "proxy.config.log.max_space_mb_headroom": ("INT", 10),
               "proxy.config.crash_log_helper": ("STRING", "/bin/true"),
               "proxy.config.exec_thread.autoconfig": ("INT", 0),
               "proxy.config.exec_thread.limit": ("INT", 2),
               # nothing leaves the host (records.config(5)): with an address to bind, traffic_server names
               # itself from that address (one reverse lookup of 127.0.0.1, answered by /etc/hosts) instead
               # of a reverse lookup of every interface address through the host's resolver; its own DNS
               # client asks proxy.config.dns.nameservers, and also the servers of proxy.config.dns.resolv_conf
               # (seen: a name it could not resolve was asked of /etc/resolv.conf's server too): ours names loopback
               "proxy.local.incoming_ip_to_bind": ("STRING", "127.0.0.1"),
               "proxy.local.outgoing_ip_to_bind": ("STRING", "127.0.0.1"),
               "proxy.config.dns.nameservers": ("STRING", dead_resolver()),
               "proxy.config.dns.resolv_conf": ("STRING", str(etc / "resolv.conf")),
               # and a name it cannot resolve fails in 2 s, not 30 (hostdb.lookup_timeout), as Squid's in a few
               "proxy.config.hostdb.lookup_timeout": ("INT", 2)}
        if throttle:
            rec["proxy.config.net.connections_throttle"] = ("INT", throttle)
        rec.update(records or {})
        (etc / "records.config").write_text("".join(f"CONFIG {k} {t} {v}\n" for k, (t, v) in rec.items()))
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        self.raw = raw_device
        (etc / "storage.config").write_text(f"{raw_device}\n" if raw_device else f"{self.dir / 'cache'} {cache_mb}M\n")
        (etc / "ip_allow.yaml").write_text("ip_allow:\n  - apply: in\n    ip_addrs: 127.0.0.1\n    action: allow\n"
                                           "  - apply: out\n    ip_addrs: 127.0.0.1\n    action: allow\n")
        (etc / "logging.yaml").write_text(f"logging:\n  formats:\n    - name: squid\n      format: '{log_format}'\n"
                                          "  logs:\n    - filename: access\n      format: squid\n      mode: ascii\n")
        # X-Cache: HIT on a fresh cache hit, as the other generated configs send it
        (etc / "xcache.config").write_text("cond %{SEND_RESPONSE_HDR_HOOK} [AND]\ncond %{CACHE} =hit-fresh\n"
                                           "set-header X-Cache HIT\n")
        (etc / "plugin.config").write_text(("stats_over_http.so\n" if stats_plugin else "") +
                                           f"header_rewrite.so {etc / 'xcache.config'}\n")
        # a reverse proxy: every path to the origin on 127.0.0.1:remap_to (remap.config(5) `map`)
        (etc / "remap.config").write_text(f"map / http://127.0.0.1:{remap_to}/\n" if remap_to else "")
        for name in ("cache.config", "hosting.config", "parent.config", "volume.config",
                     "splitdns.config", "socks.config", "ssl_multicert.config", "sni.yaml", "strategies.yaml"):
            (etc / name).write_text("")
        if os.geteuid() == 0:
            for p in [self.dir, *self.dir.rglob("*")]:
                shutil.chown(p, "trafficserver", "trafficserver")
            if raw_device:
                shutil.chown(raw_device, "trafficserver", "trafficserver")

    @property
    def conf(self) -> Path:
        return self.dir / "etc" / "records.config"

    def __enter__(self):
        self._launch(limited([self.exe, f"--run-root={self.dir / 'runroot.yaml'}"], self.nofile), timeout=90)
        return self

    def log(self, name: str = "access.log") -> str:
        try:
            return (self.dir / "log" / name).read_text(errors="replace")
        except OSError:
            return ""

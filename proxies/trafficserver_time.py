"""Traffic Server's own clocks: its transaction milestones, as its ASCII
access log carries them (the lines appended in the window) and as the
stats_over_http plugin sums them.

Milestones (trafficserver 9.2 proxy/Milestones.h; marked in
proxy/http/HttpSM.cc): SM_START (the transaction's state machine starts:
its request's first bytes), SERVER_FIRST_CONNECT and SERVER_CONNECT (the
first and the last time do_http_server_open ran: a request held by the
per-origin connection cap is rescheduled every
proxy.config.http.per_server.connection.queue_delay ms and runs it again),
SERVER_CONNECT_END (connected, or a pooled session attached),
SERVER_BEGIN_WRITE (request written), SERVER_FIRST_READ (the origin's first
byte), SM_FINISH. A log field `%<{A-B}msdms>` is A - B in ms, and -1 when A
was never reached (Milestones::difference_msec's `missing`): a cache hit
never reaches SERVER_FIRST_READ, so its -1 is no time and is left out. So:
proxy_queue = SERVER_CONNECT - SERVER_FIRST_CONNECT, origin_connect =
SERVER_CONNECT_END - SERVER_CONNECT, origin_first_byte = SERVER_FIRST_READ -
SERVER_BEGIN_WRITE; %<ttms> is SM_START to SM_FINISH.

The per-origin queue (proxy/http/HttpSM.cc do_http_server_open, 9.2):
with proxy.config.http.per_server.connection.max connections open to an
origin, a transaction waits when queue_size is -1 (no limit) or has room,
and gets 502 "origin throttled" otherwise (queue_size 0: always).

proxy.process.http.milestone.X (proxy/http/HttpTransact.cc
update_size_and_time_stats) sums X - SM_START over finished transactions
(an unreached one adds 0 there); the plugin shows them as last synced from
the threads, every proxy.config.raw_stat_sync_interval_ms (5000 by default:
lib/records/P_RecDefs.h), so a short window may see no sync at all: the
stats are then no figure. ATS buffers log lines too: a line is written up
to proxy.config.log.max_secs_per_buffer (5 s by default) after its
transaction, so at the window's end the log holds few of the window's own
transactions; the transactions that ended in an interval as long as the
window, one flush interval earlier, are read instead (the log's tail, by
%<cqtq> + %<ttms>): all of them are written by then, short or long.
"""

import json
import re
import time
from pathlib import Path
from urllib.parse import urlsplit

from proxytune.core import targetread
from .base import read_config
from .timing import (MAX_VALUES, Unavailable, Window, address, answer, decimal, digest, nothing, origin_entry,
                     parse_line, part, split_address, spread, template_regex, timed_lines, unmeasurable)

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
    return (int(v) if v.isascii() and v.isdigit() else 5) + 1


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
                and v.isascii() and v.isdigit()}


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
    port = f.get("nhp") if (f.get("nhp") or "").isdigit() and f.get("nhp") != "0" else None
    if not port:
        url = next((f[k] for k in ("pquc", "cquc", "cquuc") if (f.get(k) or "").startswith("http")), "")
        try:
            port = str(urlsplit(url).port or "")
        except ValueError:
            port = ""
    return f"{host}:{port}" if port else host



def timing(proxy) -> Window:
    log = access_log(proxy)
    if log.get("why") and proxy.conf["stats_over_http"]["value"] != "on":
        return Unavailable(proxy, f"{log['why']}, and stats_over_http is not loaded: no milestone is readable")
    return Clock(proxy, log)


# ---------------------------------------------------------------- pure

def parts(p: dict) -> dict:
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
    if not (mx.get("value") or "0").isdigit() or int(mx.get("value") or 0) <= 0:
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


def config_origins(proxy) -> dict:
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

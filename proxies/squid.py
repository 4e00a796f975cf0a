"""Squid: `squid -f CONF`, `include` followed, the cache manager's `info`
page, and its fd cap.

How it counts and refuses (squid 5: src/fd.cc, src/client_side_reply.cc,
src/comm/TcpAcceptor.cc; squid.conf.documented max_filedescriptors): Squid
counts every descriptor it opens against Squid_MaxFD (max_filedescriptors,
or the process limit at start) and keeps RESERVED_FD = min(100,
Squid_MaxFD / 4) back. With fewer than twice that free, fdUsageHigh()
holds and every reply turns client keep-alive off ("Not many unused FDs,
can't keep-alive"), so each client must reconnect; with fewer than
RESERVED_FD free, TcpAcceptor::okToAccept() defers accepting and logs
"Your cache is running out of filedescriptors", so the kernel's queue
fills long before any EMFILE. The rule's edge is the first of the two: the
cap already changes what clients get there. At the cap its cache manager
is deferred too: /proc's count of its fds stands in.
"""

import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from proxytune.core.errors import ProxytuneError
from proxytune.core.numbers import is_uint

from .base import Running, Spec, directives, nofile_now, option, peak, where
from .timing import (MAX_VALUES, Unavailable, Window, address, answer, decimal, digest, nothing, origin_entry, part,
                     spread, template_regex, timed_lines, unmeasurable)
from .cap import Cap
from .launch import Server, free_port, need

INCLUDE = re.compile(r"\s*include\s+(\S+)\s*$")
SOURCE = ("squid src/fd.cc fdUsageHigh/RESERVED_FD, src/client_side_reply.cc (keep-alive off), "
          "src/comm/TcpAcceptor.cc okToAccept (accept deferral); max_filedescriptors")
OUTSIDE_TABLE = 5        # fds squid opened outside its fd table (stdio, its log and pid files): /proc counts them


def reserve(max_fds: int) -> int:
    return min(100, max_fds // 4)


class RunningSquid(Running):
    include_re = INCLUDE

    def config_arg(self):
        return (option(self.argv, "-f") or ["/etc/squid/squid.conf"])[0]

    def parse(self):
        return directives(self.lines, ("max_filedescriptors", "http_port", "workers", "cache_dir",
                                       "server_persistent_connections"))

    def stats(self):
        port = re.search(r"(?:^|:)([0-9]+)$", ((self.conf.get("http_port") or {}).get("value") or "-").split()[0],
                         re.A)
        if not port:
            return {"available": False, "reason": "no http_port to reach the cache manager"}
        url = f"http://127.0.0.1:{port.group(1)}/squid-internal-mgr/info"
        try:
            text = self.status_page(f"127.0.0.1:{port.group(1)}", "/squid-internal-mgr/info")
        except OSError as e:
            return {"available": False, "reason": f"cache manager {url}: {e}"}
        num = lambda label: int(m.group(1)) if (m := re.search(label + r":\s*([0-9]+)", text, re.A)) else None
        return {"available": True, "source": url,
                "max_fds": num("Maximum number of file descriptors"),
                "fds_in_use": num("Number of file desc currently in use"),
                "fds_available": num("Available number of file descriptors")}

    def timing(self):
        return own_clock(self)

    def config_origins(self) -> dict:
        return clock_origins(self.lines)


class Squid(Spec, process=RunningSquid):
    kind, exe_names = "squid", ("squid",)
    order = 10
    unit, user, package = "squid", "proxy", "squid"
    host_configs = ("/etc/squid/squid.conf", "/usr/local/etc/squid/squid.conf")
    epoll = "build with --enable-epoll"           # ./configure --enable-epoll
    stores = ("ufs", "aufs", "rock")
    optional_stores = ("diskd",)
    store_design = {"ufs": "one file per object, open/create/unlink in the event loop",
                    "aufs": "one file per object, the file calls on a thread pool",
                    "rock": "one database file of fixed slots, disker process",
                    "diskd": "one file per object, the file calls in helper processes"}

    @staticmethod
    def launch(store, plan, origin_port, nofile, device=None):
        return SquidServer(store, cache_mb=plan["cache_mb"], mem_mb=plan["mem_mb"], nofile=nofile)

    @staticmethod
    def time_parts(p: dict) -> dict:
        """What its own clocks show of the window (clock_parts below)."""
        return clock_parts(p)

    @staticmethod
    def caps(ev: dict) -> list[Cap]:
        p = ev["proxy"]
        d, conf = p["directives"], p.get("config")
        # The cache manager answers only through an fd squid still accepts with, so the count it gives at
        # the window's ends can sit below the peak between them; /proc (and the sampler's peak) sees that
        # peak whether squid answers or not. The larger count decides, named with where it came from.
        mgr_used, most = peak(p, "fds_in_use") or 0, peak(p, "max_fds")
        worst = max((ev.get("procs") or {}).values(), key=lambda pr: pr.get("fd_use", 0), default={})
        sampled = max((v.get("fds_peak", 0) for v in ((ev.get("conns") or {}).get("pids") or {}).values()),
                      default=0)
        proc_used = max(worst.get("fds_open") or 0, sampled)
        used, counted = mgr_used, "Number of file desc currently in use (cache manager)"
        if proc_used > mgr_used:
            used, counted = proc_used, "its open fds in /proc (the cache manager counted fewer, or was deferred)"
        if not isinstance(most, int) or not most:
            most = worst.get("nofile_soft")
        if not isinstance(most, int) or not most:
            return []
        v = d.get("max_filedescriptors", {}).get("value", "not set")
        return [Cap("squid-fd-limit", "squid", "file-descriptor limit", f"max_filedescriptors {v}", most,
                    where(d, "max_filedescriptors", conf), used, counted,
                    most - 2 * reserve(most) - OUTSIDE_TABLE,
                    "with fewer than twice its reserve free it turns client keep-alive off (every client "
                    "reconnects); with less than its reserve free it defers accepting: clients wait in the "
                    "kernel's queue", SOURCE, Squid.fd_fix(p))]

    @staticmethod
    def fd_fix(p: dict) -> str:
        from .nginx import set_or_raise
        d, conf = p["directives"], p.get("config")
        return (set_or_raise(d, "max_filedescriptors", conf, 65536) + " and the service's LimitNOFILE with it "
                f"(profile linux/squid); squid -k reconfigure does not raise it: restart squid; {nofile_now(p)}")

    @staticmethod
    def cache_dirs_in(lines) -> list[str]:
        return [w[2] for ln in lines if len(w := ln.text.split("#", 1)[0].split()) > 2 and w[0] == "cache_dir"]

    @staticmethod
    def backlog_fix(p: dict) -> str:
        return ("squid listens with a backlog of a quarter of its fd limit (src/comm/TcpAcceptor.cc setListen: "
                "Squid_MaxFD >> 2), capped by net.core.somaxconn: raise somaxconn (profile linux/squid) and "
                "max_filedescriptors with it")

    @staticmethod
    def churn_fix(p: dict) -> str:
        return ("store objects in one large file: squid `cache_dir rock` (one database file, slots) instead of "
                "ufs/aufs/diskd, with the disker process taking the I/O off the event loop")

    @staticmethod
    def disk_fix(p: dict) -> str:
        # ufs does its opens, reads, writes and unlinks in the main loop (src/DiskIO/Blocking); aufs hands them
        # to threads (src/DiskIO/DiskThreads), rock to disker processes (src/DiskIO/IpcIo)
        d, conf = p["directives"], p.get("config")
        now = ((d.get("cache_dir") or {}).get("value") or "ufs").split()[0]
        return (f"take the disk off squid's main loop: `cache_dir aufs` (its I/O on threads) or `cache_dir rock` "
                f"(disker processes) instead of `cache_dir {now}` "
                f"({where(d, 'cache_dir', conf)}); a ufs store waits for the device in the loop")

    @staticmethod
    def port_fix(p: dict) -> str:
        d, conf = p["directives"], p.get("config")
        v = d.get("server_persistent_connections", {}).get("value", "on (default)")
        return (f"keep server connections open: `server_persistent_connections on` (now {v}, "
                f"{where(d, 'server_persistent_connections', conf)}), and a longer `server_idle_pconn_timeout`")


# ---------------------------------------------------------------- its own clocks (issue 28)
#
# Squid's own clocks: its access log's lines appended in the window (read
# as squid would read it), and its cache manager at the window's edges.
#
# Squid writes one access-log line per transaction when it ends (stdio
# writes it then, daemon hands it to its log daemon: squid.conf.documented
# access_log). What a line holds is its logformat (built-in `squid`:
# `%ts.%03tu %6tr %>a %Ss/%03>Hs %<st %rm %ru %[un %Sh/%<a %mt`): %tr is the
# transaction's time from its complete request header to its end, %Sh/%<a
# the hierarchy code and the peer (origin or cache_peer) it went to. Only a
# format with %<pt (peer response time: last request byte sent to last
# response byte received) shows the origin's time, and %<tt (first connect
# or write to the peer until its last I/O) with it the connection and the
# request's write; the built-in formats have neither.
#
# Squid has no queue of requests of its own (one event loop reads them):
# requests wait only for its helpers (url_rewrite_program, store_id_program,
# external_acl_type), whose cache-manager pages give each queue's length
# (src/helper.cc helper::packStatsInto). mgr:active_requests lists the
# transactions in flight with their age (src/stat.cc statClientRequests),
# and mgr:info's "Median Service Times" are of the 5 and 60 minutes up to
# the last full minute (src/stat.cc statPctileSvc over CountHist): context,
# not the window.

BUILTIN = {"squid": "%ts.%03tu %6tr %>a %Ss/%03>Hs %<st %rm %ru %[un %Sh/%<a %mt",
           "common": '%>a %[ui %[un [%tl] "%rm %ru HTTP/%rv" %>Hs %<st %Ss:%Sh',
           "combined": '%>a %[ui %[un [%tl] "%rm %ru HTTP/%rv" %>Hs %<st "%{Referer}>h" "%{User-Agent}>h" %Ss:%Sh',
           "referrer": "%ts.%03tu %>a %{Referer}>h %ru", "useragent": '%>a [%tl] "%{User-Agent}>h"'}
DEFAULT_LOG = "/var/log/squid/access.log"
HELPERS = {"url_rewrite_program": ("redirector", "url_rewrite_children"),
           "store_id_program": ("store_id", "store_id_children"),
           "external_acl_type": ("external_acl", "external_acl_type")}
CODE = re.compile(r"%([\"\[\'#/]?)-?0?[0-9]*(?:\.[0-9]+)?(?:\{[^}]{0,64}\})?([<>]?[A-Za-z][A-Za-z_]*"
                  r"(?:::[<>]?[A-Za-z_]+)?)(?:\{[^}]{0,64}\})?", re.A)
MECH = "squid access.log"


def format_tokens(fmt: str) -> list[tuple[str, str]]:
    """A logformat as literal and field tokens ('%%' is a literal %)."""
    out, i = [], 0
    while i < len(fmt):
        if fmt.startswith("%%", i):
            out.append(("lit", "%"))
            i += 2
            continue
        m = CODE.match(fmt, i) if fmt[i] == "%" else None
        if m:
            out.append(("field", m.group(2)))
            i = m.end()
        else:
            j = fmt.find("%", i + 1) if fmt[i] != "%" else i + 1
            j = len(fmt) if j < 0 else j
            out.append(("lit", fmt[i:j]))
            i = j
    merged: list[tuple[str, str]] = []
    for kind, text in out:                     # adjacent literals as one
        if merged and kind == "lit" and merged[-1][0] == "lit":
            merged[-1] = ("lit", merged[-1][1] + text)
        else:
            merged.append((kind, text))
    return merged


def logs(lines) -> list[dict]:
    """The access logs squid writes to a file: path, format name and text, where each is set."""
    formats = {name: {"text": text, "where": "built-in"} for name, text in BUILTIN.items()}
    for ln in lines:
        m = re.match(r"\s*logformat\s+(\S+)\s+(.+?)\s*$", ln.text)
        if m:
            formats[m.group(1)] = {"text": m.group(2), "where": f"{ln.file}:{ln.number}"}
    out, seen = [], False
    for ln in lines:
        words = ln.text.split("#", 1)[0].split()
        if len(words) < 2 or words[0] not in ("access_log", "cache_access_log"):
            continue
        seen = True
        module, _, place = words[1].partition(":")
        if not place:
            module, place = "stdio", words[1]
        if module not in ("stdio", "daemon") or not place.startswith("/"):
            continue
        name = next((w.split("=", 1)[1] for w in words[2:] if w.startswith("logformat=")), None)
        if name is None and len(words) > 2 and words[2] in formats:
            name = words[2]
        name = name or "squid"
        f = formats.get(name)
        if f:
            out.append({"path": place, "format": name, "text": f["text"], "format_where": f["where"],
                        "where": f"{ln.file}:{ln.number}"})
    if not seen:
        out.append({"path": DEFAULT_LOG, "format": "squid", "text": BUILTIN["squid"], "format_where": "built-in",
                    "where": "squid default (no access_log)"})
    return out[:4]


def helpers(lines) -> list[dict]:
    """Helpers squid queues requests for, each with the line that configures it and its children."""
    out = []
    for ln in lines:
        words = ln.text.split("#", 1)[0].split()
        if words and words[0] in HELPERS:
            page, children = HELPERS[words[0]]
            n = next((x.text for x in lines if x.text.split()[:1] == [children]), None)
            out.append({"directive": words[0], "page": page, "where": f"{ln.file}:{ln.number}",
                        "children": " ".join(n.split()[:3]) if n else f"{children} (default)"})
    return out[:4]


def peers(lines) -> dict:
    """cache_peer host -> (port, name, file:line)."""
    out = {}
    for ln in lines:
        w = ln.text.split("#", 1)[0].split()
        if len(w) >= 4 and w[0] == "cache_peer":
            name = next((x.split("=", 1)[1] for x in w[4:] if x.startswith("name=")), w[1])
            out.setdefault(w[1], (w[3], name, f"{ln.file}:{ln.number}"))
    return out


# ---------------------------------------------------------------- live

class Clock(Window):
    def __init__(self, proxy, log: dict):
        super().__init__(proxy)
        self.log = log
        self.source = f"{log['path']} (logformat {log['format']}) and the cache manager"

    def begin(self):
        self.proxy.appended(self.log["path"], window=True)
        self.data.update({"log": {k: self.log[k] for k in ("path", "format", "format_where", "where")},
                          "helpers_configured": helpers(self.proxy.lines), "peers": peers(self.proxy.lines)})
        # the manager answers on its http_port only when http_access allows it; an accelerator forwards the
        # path to its origin instead: its pages are read only when `info` is squid's own
        self.manager = "Squid Object Cache" in (self._page("info") or "")
        self.data["manager"] = self.manager
        self.data["helpers_start"] = self._helpers()

    def end(self):
        text = self.proxy.appended(self.log["path"], window=True)
        self.data["lines"] = read_lines(text, self.log["text"])
        self.data["helpers_end"] = self._helpers()
        self.data["in_flight"] = self._active()

    manager = True

    def _page(self, name: str) -> str | None:
        if not self.manager:
            return None
        port = re.search(r"(?:^|:)([0-9]{1,5})$", ((self.proxy.conf.get("http_port") or {}).get("value") or "-")
                         .split()[0], re.A)
        if not port:
            return None
        try:
            return self.proxy.status_page(f"127.0.0.1:{port.group(1)}", f"/squid-internal-mgr/{name}")
        except OSError:
            return None

    def _helpers(self) -> dict:
        out = {}
        for h in self.data.get("helpers_configured") or []:
            text = self._page(h["page"]) or ""
            q = re.findall(r"queue length:\s*([0-9]{1,9})", text, re.A)
            svc = re.findall(r"avg service time:\s*([0-9]{1,9}) msec", text, re.A)
            if q:
                out[h["page"]] = {"queue": sum(int(x) for x in q), "avg_service_ms": int(svc[0]) if svc else None}
        return out

    def _active(self) -> dict | None:
        text = self._page("active_requests")
        if text is None:
            return None
        ages = [a for x in re.findall(r"\(([0-9]{1,9}\.[0-9]{1,9}) seconds ago\)", text, re.A)[:MAX_VALUES]
                if (a := decimal(x)) is not None]
        s = spread(ages)
        return {"count": len(ages), "oldest_s": max(ages) if ages else None, "p50_s": s["p50"]}


def read_lines(text: str, fmt: str) -> dict:
    """Per transaction of the window: %tr, and %<pt / %<tt with the peer when the format has them."""
    lf = template_regex(format_tokens(fmt))
    if lf is None:
        return {"understood": False}
    have = set(lf.groups)
    got, unread = timed_lines(text, lf, "tr")
    total, by = [tr for _, tr in got], {}
    for f, _ in got:
        peer = (f.get("<a") or "-").strip()
        pt, tt = decimal(f.get("<pt")), decimal(f.get("<tt"))
        if peer not in ("-", "") and len(peer) <= 45 and (pt is not None or tt is not None):
            o = by.setdefault(_origin(peer, f), {"hier": (f.get("Sh") or "")[:32], "pt": [], "tt": []})
            if pt is not None and pt >= 0:
                o["pt"].append(pt)
            if tt is not None and pt is not None and tt >= pt >= 0:
                o["tt"].append(tt - pt)
    return {"understood": True, "fields": sorted(have & {"tr", "<pt", "<tt", "<a", "<p", "Sh"}),
            "requests": len(total), "unread": unread, "total": spread(total),
            "origins": {k: {"hier": v["hier"], "first_byte": digest(v["pt"]), "connect": digest(v["tt"])}
                        for k, v in list(by.items())[:64]}}


def _origin(peer: str, f: dict) -> str:
    """peer:port: %<p when logged; the URL's port only when squid went direct (HIER_DIRECT): to a
    cache_peer the URL names what the client asked for (an accelerator's own port), so its port is the
    cache_peer line's, found from the config."""
    port = (f.get("<p") or "").strip()
    ru = f.get("ru") or ""
    if not is_uint(port) and (f.get("Sh") or "").startswith("HIER_DIRECT") and ru.startswith("http"):
        try:
            port = str(urlsplit(ru).port or 80)
        except ValueError:
            port = ""
    return f"{peer}:{port}" if is_uint(port) else peer



def own_clock(proxy) -> Window:
    found = logs(proxy.lines)
    if not found:
        return Unavailable(proxy, "squid logs to no file (access_log none, syslog, udp or tcp): no per-request times")
    return Clock(proxy, found[0])


# ---------------------------------------------------------------- pure

def clock_parts(p: dict) -> dict:
    t = p.get("timing") or {}
    lines = t.get("lines") or {}
    if not t.get("available") or not lines:
        return nothing(t.get("reason") or "squid's access log was not read in this window", MECH)
    log = t.get("log") or {}
    named = f"{log.get('path')} (logformat {log.get('format')}, {log.get('format_where')})"
    if not lines.get("understood"):
        return nothing(f"the logformat of {named} is not understood", MECH)
    n = lines.get("requests") or 0
    source = f"transactions logged to {log.get('path')} in the window"
    if not n:
        return {**nothing(f"no transaction was logged to {named} in the window", MECH),
                "requests": {"n": 0, "source": source}}
    tot = lines["total"]
    total = part(tot["mean"], f"{MECH} %tr: from the complete request header to the transaction's end "
                 "(src/cf.data.pre logformat)", f"whole ms, each transaction logged in the window ({named})",
                 samples=n, requests=n, p50=tot["p50"], p99=tot["p99"])
    out = {}
    for name, key, code, what in (("origin_first_byte", "first_byte", "<pt", "%<pt: from the last request byte sent to "
                                   "the peer to the last response byte received"),
                                  ("origin_connect", "connect", "<tt", "%<tt - %<pt: connecting to the peer and "
                                   "writing the request")):
        if code not in lines.get("fields", []) or (key == "connect" and "<pt" not in lines.get("fields", [])):
            out[name] = unmeasurable(f"{named} has no %{code}: squid logs no origin time in it", MECH)
            continue
        out[name] = _origin_part(t, lines, key, f"{MECH} {what}", named)
    out["proxy_queue"] = _queue(t, n)
    return answer(out, total, n, source)


def _origin_part(t: dict, lines: dict, key: str, mechanism: str, named: str) -> dict:
    conf = t.get("peers") or {}
    origins = lines.get("origins") or {}
    total = sum(o[key]["sum_ms"] for o in origins.values())
    count = sum(o[key]["n"] for o in origins.values())
    if not count:
        return unmeasurable("no transaction went to a peer or origin in the window: all served by squid", mechanism)
    by = {}
    for addr, o in origins.items():
        if not o[key]["n"]:
            continue
        host, _, port = addr.partition(":")
        peer = conf.get(host)
        key_addr = address(host, port or (peer[0] if peer else "")) or addr
        by[key_addr] = origin_entry(f"cache_peer {peer[1]} ({o['hier']})" if peer else o["hier"] or "direct",
                                    peer[2] if peer else None, o[key]["sum_ms"] / o[key]["n"], o[key]["n"])
    busiest = max(origins.values(), key=lambda o: o[key]["n"])[key]
    return part(total / count, mechanism, f"whole ms, each transaction logged in the window ({named})",
                samples=count, requests=count, population="requests that went to a peer or origin", by_origin=by,
                p50=busiest["p50"], p99=busiest["p99"])


def _queue(t: dict, n: int) -> dict:
    configured = t.get("helpers_configured") or []
    if not configured:
        return unmeasurable("squid keeps no queue of requests of its own (one event loop reads them); requests "
                            "wait only for helpers, and none is configured", MECH)
    got = [h for h in (t.get("helpers_start") or {}, t.get("helpers_end") or {}) if h]
    if not got:
        return unmeasurable("the cache manager's helper pages were not readable (http_access to manager)",
                            "squid cache manager")
    lengths = [sum(v.get("queue") or 0 for v in g.values()) for g in got]
    window = t.get("window_s") or 0
    h = configured[0]
    return part(sum(lengths) / len(lengths) * window * 1000 / n if window else None,
                "squid cache manager helper pages, queue length (src/helper.cc helper::packStatsInto): Little's "
                "law on its mean at the window's edges", f"{len(lengths)} readings of the queue length",
                samples=len(lengths), requests=n,
                cause={"what": f"helper {h['page']}", "directive": h["children"], "where": h["where"], "limit": None,
                       "queue_now": lengths[-1], "queue_max": max(lengths)})


def clock_origins(lines) -> dict:
    """cache_peer lines whose host is an address: IP:PORT -> cache_peer NAME."""
    return {addr: {"name": f"cache_peer {name}", "where": where}
            for host, (port, name, where) in peers(lines).items() if (addr := address(host, port))}


class SquidServer(Server):
    """Squid in the foreground (-N) with one cache_dir of the given store type (objects on disk
    only with mem_mb=0), an access log to read hits from, and optionally a given fd limit."""

    def __init__(self, store: str = "ufs", cache_mb: int = 100, mem_mb: int = 0, user: str = "proxy",
                 nofile: tuple[int, int] | None = None, cache_dir: Path | None = None,
                 max_filedescriptors: int | None = None, manager: bool = True, accel_to: int | None = None,
                 logformat: str | None = None, cpus: str | None = None, levels: tuple[int, int] = (16, 256)):
        """levels: ufs/aufs/diskd's first- and second-level directories (Squid's default 16 256;
        squid -z makes them all and our exit deletes them: 4,096 directories cost ~2.5 s a start)."""
        if store not in ("ufs", "aufs", "diskd", "rock"):
            raise ProxytuneError(f"unknown squid store {store!r}", "ufs, aufs, diskd or rock")
        self.exe = need("squid", Squid.package)
        self.dir = Path(tempfile.mkdtemp(prefix="proxytune-squid-"))
        self.cache = Path(cache_dir) if cache_dir else self.dir / "cache"     # e.g. on a mount of its own
        self.cache.mkdir(exist_ok=True)
        self.port = free_port()
        self.store = store
        self.nofile = nofile            # (soft, hard) to start with, as a service's LimitNOFILE would
        self.cpus = cpus                # a CPU list for taskset (its kid inherits it), e.g. away from the load
        self.grace = 15
        # SIGKILL: its cache dir is deleted next, so a clean shutdown (SIGTERM waits out shutdown_lifetime,
        # SIGINT still writes swap.state: 2-3 s) saves nothing, and its logs were read while it ran
        self.stop_signal = signal.SIGKILL
        levels = "" if store == "rock" else f" {int(levels[0])} {int(levels[1])}"
        # accel_to: a reverse proxy (accelerator) in front of 127.0.0.1:accel_to, an IP literal (no lookup)
        port = (f"http_port 127.0.0.1:{self.port} accel defaultsite=127.0.0.1:{accel_to}\n"
                f"cache_peer 127.0.0.1 parent {accel_to} 0 no-query originserver name=origin\n"
                if accel_to else f"http_port 127.0.0.1:{self.port}\n")
        fds = f"max_filedescriptors {max_filedescriptors}\n" if max_filedescriptors else ""
        (self.dir / "squid.conf").write_text(
            f"{port}{fds}cache_dir {store} {self.cache} {cache_mb}{levels}\n"
            f"cache_mem {mem_mb} MB\nmaximum_object_size_in_memory {'0 KB' if mem_mb == 0 else '512 KB'}\n"
            f"pid_filename {self.dir}/squid.pid\ncache_log {self.dir}/cache.log\n"
            + (f"logformat custom {logformat}\naccess_log stdio:{self.dir}/access.log custom\n" if logformat
               else f"access_log stdio:{self.dir}/access.log\n") +
            f"cache_store_log none\ncoredump_dir {self.dir}\n"
            + ("http_access deny manager\n" if not manager else "") +   # the cache manager refused
            f"http_access allow all\ncache_effective_user {user}\nshutdown_lifetime 1 seconds\n"
            "workers 1\n"
            # nothing leaves the host (squid.conf.documented): Squid's own DNS client asks dns_nameservers
            # instead of /etc/resolv.conf (port 53 is fixed there); visible_hostname spares the lookup of
            # this host's own name at start; pinger_enable off: no ICMP helper; dns_timeout: a name asked
            # of it fails in a second (nothing answers there) instead of holding the request 30 s
            "dns_nameservers 127.0.0.1\ndns_timeout 1 seconds\nvisible_hostname localhost\npinger_enable off\n")
        shutil.chown(self.dir, user, user) if os.geteuid() == 0 else None
        shutil.chown(self.cache, user, user) if os.geteuid() == 0 else None

    @property
    def conf(self) -> Path:
        return self.dir / "squid.conf"

    def log(self, name: str) -> str:
        try:
            return (self.dir / name).read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self):
        z = subprocess.run([self.exe, "-z", "-N", "-f", str(self.conf)], capture_output=True, text=True, timeout=120)
        if z.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise ProxytuneError(f"squid -z failed: {(z.stderr or z.stdout).strip()[-300:]}")
        limit = ["prlimit", f"--nofile={self.nofile[0]}:{self.nofile[1]}", "--"] if self.nofile else []
        pin = ["taskset", "-c", self.cpus] if self.cpus else []
        self._launch(limit + pin + [self.exe, "-N", "-f", str(self.conf)], timeout=60)
        return self

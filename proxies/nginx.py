"""nginx: `nginx -c CONF [-p PREFIX]` (its master rewrites argv), includes
followed, stub_status when a location enables it, the error log.

How it counts and refuses (nginx 1.22): each worker has worker_connections
connection slots, taken by every socket it holds: clients, upstreams, its
listening sockets and its channel to the master (src/core/ngx_connection.c,
ngx_get_connection). Once no more than 1/16 are free it closes
max(1, min(32, reusable / 8)) reusable connections (idle keep-alive ones and
those still waiting for their first request) to make room
(ngx_drain_connections, logged at `warn`, which the default error_log level
hides: "worker_connections are not enough, reusing connections"); with
none free the new connection is closed and "worker_connections are not
enough" is logged at `alert`. So a worker under pressure saw-tooths between
n - n/16 - min(32, n/8) and n connections: that lower edge is where a
sample of its sockets proves the cap. The top of the tooth can last
milliseconds only: clients that come back in bursts are accepted, each
proxied request holds a client and an upstream connection (not reusable)
until its answer, and the drain closes the oldest reusable ones; once the
burst is answered its upstreams are closed and the worker falls far below
the edge until the next one (measured: a worker of 64 sat at 40-47 sockets
at every 0.25 s tick while it closed ~1,000 idle clients a second). So the
peak is also read from the open-fd count every 10 ms (connsample.FdPeaks),
less the fds that are not sockets. With `accept_mutex on` and several workers,
a worker with fewer than 1/8 free stops taking the accept mutex
(ngx_accept_disabled in src/event/ngx_event_accept.c, used in
src/event/ngx_event.c ngx_process_events_and_timers), so clients wait in
the kernel's queue. Every worker is read; the cap is per worker.
"""

import os
import re
import shutil
import tempfile
from pathlib import Path

from .base import Running, Spec, as_int, delta, directives, nofile_now, option, where
from .timing import (MAX_VALUES, Unavailable, Window, answer, decimal, digest, nothing, origin_entry, parse_line, part,
                     split_address, spread, template_regex, unmeasurable)
from .cap import Cap
from .launch import Server, dead_resolver, free_port, limited, need, tempdir

INCLUDE = re.compile(r"\s*include\s+([^;\s]+)\s*;")
SOURCE = ("nginx src/core/ngx_connection.c ngx_get_connection/ngx_drain_connections; "
          "src/event/ngx_event_accept.c ngx_accept_disabled (with accept_mutex)")
DEFAULT_CONNECTIONS = 512


class RunningNginx(Running):
    include_re = INCLUDE

    def config_arg(self):
        conf = (option(self.argv, "-c") or ["/etc/nginx/nginx.conf"])[0]
        prefix = (option(self.argv, "-p") or [""])[0]
        return conf if conf.startswith("/") or not prefix else str(Path(prefix) / conf)

    def parse(self):
        d = directives(self.lines, ("worker_connections", "worker_rlimit_nofile", "worker_processes",
                                    "error_log", "accept_mutex", "multi_accept"))
        text = "\n".join(ln.text for ln in self.lines)
        m = re.search(r"listen\s+([\w.:\[\]]+)[^;]*;(?:(?!server\s*\{).)*?location\s+(?:=\s*)?([^\s{]+)\s*\{\s*"
                      r"stub_status", text, re.S)
        if m:
            d["stub_status"] = {"value": f"{m.group(1)} {m.group(2)}", "line": None}
        return d

    def error_log(self) -> str | None:
        path = ((self.conf.get("error_log") or {}).get("value") or "/var/log/nginx/error.log").split()[0]
        return path if path.startswith("/") else None

    def stats(self):
        log = self.error_log()
        out = {"available": False, "reason": "stub_status is not enabled"}
        if "stub_status" in self.conf:
            addr, loc = self.conf["stub_status"]["value"].split()
            host_port = addr if ":" in addr else f"127.0.0.1:{addr}"
            try:
                m = re.search(r"Active connections:\s*([0-9]+)", self.status_page(host_port, loc), re.A)
                if not m:
                    raise ConnectionError("no 'Active connections' in its answer")
                out = {"available": True, "source": f"stub_status http://{host_port}{loc}", "active": int(m.group(1))}
            except OSError as e:
                out = {"available": False, "reason": f"stub_status: {e}"}
        if log:
            text = self.appended(log)
            out["not_enough_messages"] = text.count("worker_connections are not enough")
            out["reusing_messages"] = text.count("worker_connections are not enough, reusing connections")
        return out

    def timing(self):
        return own_clock(self)

    def config_origins(self) -> dict:
        return clock_origins(self.lines)


class Nginx(Spec, process=RunningNginx):
    kind, exe_names = "nginx", ("nginx",)
    order = 20
    # nginx-light: the smallest of Debian's nginx packages, with proxy_cache and stub_status
    unit, user, package = "nginx", "www-data", "nginx-light"
    host_configs = ("/etc/nginx/nginx.conf", "/etc/nginx/conf.d/*.conf", "/etc/nginx/sites-enabled/*")
    epoll = "events { use epoll; }"
    stores = ("proxy_cache",)
    store_design = {"proxy_cache": "one file per object (temp file + rename), metadata in shared memory"}

    @staticmethod
    def launch(store, plan, origin_port, nofile, device=None):
        return NginxCache(origin_port, plan["cache_mb"], nofile=nofile)

    @staticmethod
    def time_parts(p: dict) -> dict:
        """What its own clocks show of the window (clock_parts below)."""
        return clock_parts(p)

    @staticmethod
    def caps(ev: dict) -> list[Cap]:
        p, conns = ev["proxy"], ev.get("conns") or {}
        d, conf = p["directives"], p.get("config")
        wc = as_int(d, "worker_connections", DEFAULT_CONNECTIONS)
        procs = conns.get("pids") or {}
        if not procs or not wc:
            return []
        pid, busiest = max(procs.items(), key=lambda kv: sockets_peak(kv[1]))
        several = (d.get("worker_processes") or {}).get("value", "1") != "1"
        mutex = (d.get("accept_mutex") or {}).get("value") == "on" and several
        stops = wc - wc // 8 if mutex else wc - wc // 16 - min(32, wc // 8) - 1
        at = ("it stops taking the accept mutex (fewer than 1/8 free), so clients wait in the kernel's queue"
              if mutex else "it closes idle and waiting connections to make room (1/16 free), then closes new "
              "ones (\"worker_connections are not enough\")")
        said = delta(p, "not_enough_messages")
        if said is None:
            said = (p.get("stats_after") or {}).get("not_enough_messages")
        w = where(d, "worker_connections", conf)
        return [Cap("nginx-worker-connections", "nginx", f"worker_connections (busiest worker, pid {pid})", f"worker_connections {wc}", wc, w, sockets_peak(busiest),
                    "sockets the worker holds: clients, upstreams, listeners, its channel (peak of the 0.25 s "
                    "socket samples and of its open-fd count read between them, less its other fds)", stops, at, SOURCE,
                    f"raise `worker_connections {wc}` in the events block ({w}), e.g. 16384 (a proxied request "
                    "holds two), and worker_rlimit_nofile to at least twice it (profile linux/nginx for the "
                    "service's LimitNOFILE)", refused={"not_enough_messages": said or 0})]

    @staticmethod
    def fd_fix(p: dict) -> str:
        d, conf = p["directives"], p.get("config")
        return (set_or_raise(d, "worker_rlimit_nofile", conf, 65536) + ", keeping worker_connections "
                f"({d.get('worker_connections', {}).get('value', DEFAULT_CONNECTIONS)}) below it; "
                f"the service's LimitNOFILE with it (profile linux/nginx); {nofile_now(p)}")

    @staticmethod
    def cache_dirs_in(lines) -> list[str]:
        statements = (st.split() for ln in lines for st in re.split(r"[;{}]", ln.text.split("#", 1)[0]))
        return [w[1] for w in statements if len(w) > 1 and w[0] == "proxy_cache_path"]

    @staticmethod
    def backlog_fix(p: dict) -> str:
        return ("nginx: `listen … backlog=8192;` on the server's listen line (default 511), with "
                "net.core.somaxconn at least that (profile linux/nginx)")

    @staticmethod
    def churn_fix(p: dict) -> str:
        return ("nginx's proxy_cache keeps one file per object by design: `proxy_cache_min_uses 2` stores only "
                "objects asked for twice, `use_temp_path=off` on proxy_cache_path writes them in place (no "
                "cross-directory rename), and a larger `inactive=` evicts less; or put its cache on tmpfs")

    @staticmethod
    def disk_fix(p: dict) -> str:
        # ngx_http_core_module: `aio threads` reads files on a thread pool (--with-threads, as Debian builds it);
        # `aio_write on` (1.9.13) writes the temporary files of proxied responses there too; opening and renaming
        # a proxy_cache file stay in the worker
        return ("take the disk off nginx's workers: `aio threads;` and `aio_write on;` in the http or location "
                "block (reads, and the temporary files of proxied responses, on a thread pool); `use_temp_path=off` "
                "on proxy_cache_path writes each object once, in place; the opens and renames stay in the worker, "
                "so a cache on a slow or sync-mounted disk wants a faster one (or tmpfs)")

    @staticmethod
    def port_fix(p: dict) -> str:
        return ("reuse upstream connections: `keepalive 64;` in the upstream block, with "
                "`proxy_http_version 1.1;` and `proxy_set_header Connection \"\";` in the location; "
                "or spread them over source addresses with `proxy_bind`")


def sockets_peak(sampled: dict) -> int:
    """A worker's peak sockets: the ticks' count, or the fine fd count's peak less its non-socket fds."""
    return max(sampled.get("sockets_peak", 0), sampled.get("sockets_peak_fine", 0))


def set_or_raise(d: dict, name: str, conf: str | None, wanted: int) -> str:
    if d.get(name, {}).get("value"):
        return f"raise `{name} {d[name]['value']}` ({where(d, name, conf)}) to {wanted}"
    return f"set `{name} {wanted}` in {conf} (not set now: the limit the process started with applies)"


# ---------------------------------------------------------------- its own clocks (issue 28)
#
# nginx's own clocks: only what its access log carries, read from the
# lines appended in the window (as nginx would read the file).
#
# nginx OSS keeps no queue of requests: a worker reads every connection it
# accepts at once (the wait before that is the kernel's accept queue), and
# the upstream `queue` directive is NGINX Plus only (ngx_http_upstream_module
# documentation). It keeps no timing counters either (stub_status counts
# connections): the times are the log's variables, when its log_format has
# them (ngx_http_upstream_module "Embedded Variables", nginx 1.22
# src/http/ngx_http_upstream.c): $upstream_connect_time and
# $upstream_header_time both count from the start of connecting to the
# upstream (u->start_time, set in ngx_http_upstream_connect), up to the
# connection and up to the response header; so the origin's first byte is
# header - connect. $request_time runs from the first bytes read from the
# client to the log. All of them in seconds with ms resolution, taken from
# the worker's cached clock (ngx_current_msec, updated once per event-loop
# pass): a late loop shows in them. Several upstreams tried for one request
# are listed comma-separated (", "), internal redirects with " : ".

TIMES = ("upstream_connect_time", "upstream_header_time", "request_time")
NO_QUEUE = ("nginx OSS has no request queue: a worker reads each connection it accepts at once (the wait before "
            "is the kernel's accept queue); upstream `queue` is NGINX Plus only")
COMBINED = ('$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" '
            '"$http_user_agent"')
VAR = re.compile(r"\$(?:\{([A-Za-z0-9_]{1,64})\}|([A-Za-z0-9_]{1,64}))")
MECH = "nginx access log"


def statements(lines) -> list[tuple[list[str], str]]:
    """The config's statements (words, with quoted strings kept whole) and the file:line of each start."""
    out, words, start = [], [], None
    for ln in lines:
        for tok in re.findall(r"'[^']*'|\"[^\"]*\"|[;{}]|[^\s;{}'\"]+", ln.text.split("#", 1)[0]
                              if "'" not in ln.text and '"' not in ln.text else ln.text):
            if tok in (";", "{", "}"):
                if words:
                    out.append((words, start))
                words, start = [], None
                continue
            if start is None:
                start = f"{ln.file}:{ln.number}"
            words.append(tok)
        if len(out) > 20000:
            break
    return out


def formats_and_logs(lines) -> tuple[dict, list[dict]]:
    formats = {"combined": {"text": COMBINED, "where": "built-in"}}
    logs = []
    for words, at in statements(lines):
        if words[0] == "log_format" and len(words) > 2:
            body = [w for w in words[2:] if not w.startswith("escape=")]
            formats[words[1]] = {"text": "".join(w[1:-1] if w[:1] in "'\"" else w for w in body), "where": at}
        elif words[0] == "access_log" and len(words) > 1:
            logs.append({"path": words[1].strip("'\""), "format": words[2] if len(words) > 2 and "=" not in words[2]
                         else "combined", "buffered": any(w.startswith("buffer=") for w in words[2:]),
                         "where": at})
    return formats, logs


def tokens(fmt: str) -> list[tuple[str, str]]:
    out, i = [], 0
    for m in VAR.finditer(fmt):
        if m.start() > i:
            out.append(("lit", fmt[i:m.start()]))
        out.append(("field", m.group(1) or m.group(2)))
        i = m.end()
    if i < len(fmt):
        out.append(("lit", fmt[i:]))
    return out


def choose_log(proxy) -> dict:
    """The file log whose format carries the most of the timing variables, or why none does."""
    formats, logs = formats_and_logs(proxy.lines)
    best, why = None, "no access_log"
    for log in logs:
        if log["path"] in ("off",) or log["path"].startswith(("syslog:", "memory:")):
            why = f"access_log {log['path']} ({log['where']}): not a file"
            continue
        fmt = formats.get(log["format"])
        if not fmt:
            continue
        have = [v for v in TIMES + ("upstream_addr",) if re.search(rf"\$\{{?{v}\b", fmt["text"])]
        if not log["path"].startswith("/"):        # relative to nginx's prefix (-p, Debian's /usr/share/nginx)
            log["path"] = f"{(option(proxy.argv, '-p') or ['/usr/share/nginx'])[0].rstrip('/')}/{log['path']}"
        if best is None or len(have) > len(best["have"]):
            best = {**log, "text": fmt["text"], "format_where": fmt["where"], "have": have}
    if best and not best["have"]:
        return {"why": f"the log_format {best['format']} ({best['format_where']}) of {best['path']} has none of "
                       "$request_time, $upstream_connect_time, $upstream_header_time"}
    return best or {"why": why}


class Clock(Window):
    def __init__(self, proxy, log: dict):
        super().__init__(proxy)
        self.log = log
        self.source = f"{log['path']} (log_format {log['format']})"

    def begin(self):
        self.data["log"] = {k: v for k, v in self.log.items() if k != "text"}
        self.data["upstreams"] = upstream_lines(self.proxy.lines)
        self.proxy.appended(self.log["path"], window=True)

    def end(self):
        self.data["lines"] = read_lines(self.proxy.appended(self.log["path"], window=True), self.log["text"])


def upstream_lines(lines) -> dict:
    """ip:port -> (upstream block or proxy_pass, file:line) for every address the config sends to."""
    out, block = {}, None
    for words, at in statements(lines):
        if words[0] == "upstream" and len(words) > 1:
            block = words[1]
        elif words[0] == "server" and block and len(words) > 1:
            out.setdefault(words[1], (f"upstream {block}", at))
        elif words[0] == "proxy_pass" and len(words) > 1:
            m = re.match(r"https?://([0-9.]+:[0-9]{1,5})", words[1])
            if m:
                out.setdefault(m.group(1), (f"proxy_pass {words[1][:100]}", at))
    return dict(list(out.items())[:64])


def _seconds(text: str | None) -> float | None:
    """The sum of a variable's values (several upstreams, redirects) in ms; None for '-' or junk."""
    if not text:
        return None
    vals = [decimal(v.strip()) for v in re.split(r",|:", text)]
    if not vals or any(v is None for v in vals):
        return None
    return sum(vals) * 1000


def read_lines(text: str, fmt: str) -> dict:
    lf = template_regex(tokens(fmt), frozenset(v for v in re.findall(r"upstream_\w+", fmt)))
    if lf is None:
        return {"understood": False}
    have = set(lf.groups)
    total, connect, first, by, unread, read = [], [], [], {}, 0, 0
    for line in text.splitlines()[:MAX_VALUES]:
        f = parse_line(lf, line)
        if f is None:
            unread += 1
            continue
        read += 1
        ct, ht, rt = (_seconds(f.get(k)) for k in TIMES)
        if rt is not None:
            total.append(rt)
        if ct is not None:
            connect.append(ct)
        if ht is not None and ct is not None and ht >= ct:
            first.append(ht - ct)
            addr = re.split(r",| : ", f.get("upstream_addr") or "")[-1].strip()
            if re.fullmatch(r"[0-9A-Fa-f.:\[\]]{3,47}", addr):
                by.setdefault(addr, []).append(ht - ct)
    return {"understood": True, "fields": sorted(have & set(TIMES + ("upstream_addr",))),
            "lines": read, "unread": unread,
            "total": spread(total), "connect": digest(connect), "first_byte": digest(first),
            "origins": {a: digest(v) for a, v in list(by.items())[:64]}}



def own_clock(proxy) -> Window:
    log = choose_log(proxy)
    if log.get("why"):
        return Unavailable(proxy, log["why"])
    return Clock(proxy, log)


# ---------------------------------------------------------------- pure

def clock_parts(p: dict) -> dict:
    t = p.get("timing") or {}
    queue = unmeasurable(NO_QUEUE, "nginx 1.22 (no request queue in OSS)")
    lines, log = t.get("lines") or {}, t.get("log") or {}
    if not t.get("available") or not lines.get("understood"):
        why = t.get("reason") or ("the log_format is not understood" if t.get("available") else
                                  "nginx's access log was not read in this window")
        got = nothing(why, MECH)
        got["parts"]["proxy_queue"] = queue
        return got
    n = lines.get("lines") or 0
    named = f"{log.get('path')} (log_format {log.get('format')}, {log.get('format_where')})"
    source = f"requests logged to {log.get('path')} in the window"
    if not n:
        got = nothing(f"no request was logged to {named} in the window", MECH)
        got["parts"]["proxy_queue"] = queue
        return {**got, "requests": {"n": 0, "source": source}}
    prec = f"ms resolution of the worker's cached clock, each request logged in the window ({named})" + (
        "; a buffered log (buffer=) writes late" if log.get("buffered") else "")
    tot = lines["total"]
    total = (part(tot["mean"], f"{MECH} $request_time: first client bytes read to the log", prec, samples=tot["n"],
                  requests=tot["n"], p50=tot["p50"], p99=tot["p99"])
             if "request_time" in lines["fields"] and tot["n"] else unmeasurable(f"{named} has no $request_time", MECH))
    ups = t.get("upstreams") or {}
    out = {"proxy_queue": queue}
    for name, key, what in (("origin_connect", "connect", "$upstream_connect_time"),
                            ("origin_first_byte", "first_byte", "$upstream_header_time - $upstream_connect_time")):
        d = lines[key]
        if not d["n"]:
            out[name] = unmeasurable(f"{named} has no {what.split(' ')[0]}, or no request went upstream", MECH)
            continue
        by = {(split_address(a) or a): origin_entry((ups.get(a) or ("upstream",))[0], (ups.get(a) or (0, None))[1],
                                                    v["sum_ms"] / v["n"], v["n"])
              for a, v in lines["origins"].items() if v["n"]} if key == "first_byte" else None
        out[name] = part(d["sum_ms"] / d["n"], f"{MECH} {what}", prec, samples=d["n"], requests=d["n"],
                         population="requests that went upstream", by_origin=by, p50=d["p50"], p99=d["p99"])
    return answer(out, total, n, source)


def clock_origins(lines) -> dict:
    return {addr: {"name": name, "where": where} for a, (name, where) in upstream_lines(lines).items()
            if (addr := split_address(a))}


class NginxServer(Server):
    """nginx answering every request itself (`return 200`), or with the given server block body."""

    def __init__(self, workers: int = 1, rlimit_nofile: int | None = None, connections: int = 4096,
                 body: str = 'add_header Cache-Control "max-age=3600"; return 200 "ok\\n";',
                 listen: str = "backlog=4096", stub_status: bool = False, events_include: bool = False,
                 timed_log: bool = False):
        self.exe = need("nginx", Nginx.package)
        self.dir = Path(tempfile.mkdtemp(prefix="proxytune-nginx-"))
        self.port = free_port()
        rl = f"worker_rlimit_nofile {rlimit_nofile};\n" if rlimit_nofile else ""
        events = f"events {{ worker_connections {connections}; }}\n"
        if events_include:              # the events block from a file of its own, as distributions split configs
            (self.dir / "events.conf").write_text(events)
            events = f"include {self.dir / 'events.conf'};\n"
        status = "location /nginx_status { stub_status; } " if stub_status else ""
        (self.dir / "nginx.conf").write_text(
            f"worker_processes {workers};\n{rl}daemon off;\npid {self.dir}/nginx.pid;\n"
            f"error_log {self.dir}/error.log;\n{events}"
            # nginx resolves names itself only through `resolver` (ngx_http_core_module, "resolver"); the
            # listen and any upstream here are IP literals, which need no lookup
            f"http {{ {self._access_log(timed_log)} resolver {dead_resolver()}; "
            f"server {{ listen 127.0.0.1:{self.port} {listen}; {status}"
            f"location / {{ {body} }} }} }}\n")

    def _access_log(self, timed: bool) -> str:
        """`access_log off`, or a log whose format carries nginx's request and upstream times."""
        if not timed:
            return "access_log off;"
        return ("log_format timed '$remote_addr [$time_local] \"$request\" $status rt=$request_time "
                "uct=$upstream_connect_time uht=$upstream_header_time ua=$upstream_addr'; "
                f"access_log {self.dir}/access.log timed;")

    def __enter__(self):
        self._launch([self.exe, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf")])
        return self

    def error_log(self) -> str:
        try:
            return (self.dir / "error.log").read_text()
        except OSError:
            return ""


class NginxCache(Server):
    """nginx as a caching reverse proxy: proxy_cache on a directory (one file per object)."""

    def __init__(self, origin_port: int, cache_mb: int = 256, workers: int = 1, nofile: tuple | None = None,
                 connections: int = 8192, cache_dir: Path | None = None, listen: str = "backlog=4096"):
        self.exe = need("nginx", Nginx.package)
        self.dir, self.port = tempdir("nginxcache", "www-data"), free_port()
        self.cache, self.nofile = (Path(cache_dir) if cache_dir else self.dir / "cache"), nofile
        self.cache.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.cache, "www-data", "www-data")
        (self.dir / "nginx.conf").write_text(
            f"worker_processes {workers};\ndaemon off;\npid {self.dir}/nginx.pid;\nerror_log {self.dir}/error.log;\n"
            f"events {{ worker_connections {connections}; }}\n"
            # as NginxServer: nginx resolves through `resolver` only, and here every address is an IP literal
            f"http {{ access_log off; resolver {dead_resolver()};\n"
            f"  proxy_cache_path {self.cache} levels=1:2 keys_zone=c:16m max_size={cache_mb}m "
            f"inactive=1d use_temp_path=off;\n  server {{ listen 127.0.0.1:{self.port} {listen};\n"
            f"    location / {{ proxy_pass http://127.0.0.1:{origin_port}; proxy_cache c; proxy_cache_key $uri; "
            "add_header X-Cache $upstream_cache_status; } } }\n")

    def __enter__(self):
        self._launch(limited([self.exe, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf")], self.nofile))
        return self

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

import re
from pathlib import Path

from ..owncap import Cap
from . import nginx_time
from .base import Proxy, as_int, delta, directives, nofile_now, option, where

INCLUDE = re.compile(r"\s*include\s+([^;\s]+)\s*;")
SOURCE = ("nginx src/core/ngx_connection.c ngx_get_connection/ngx_drain_connections; "
          "src/event/ngx_event_accept.c ngx_accept_disabled (with accept_mutex)")
DEFAULT_CONNECTIONS = 512


class Nginx(Proxy):
    kind, exe_names = "nginx", ("nginx",)
    unit, user, package = "nginx", "www-data", "nginx"
    include_re = INCLUDE
    stores = ("proxy_cache",)
    store_design = {"proxy_cache": "one file per object (temp file + rename), metadata in shared memory"}

    @staticmethod
    def bench(store, plan, origin_port, nofile):
        from proxytune.microbench import proxyservers
        return proxyservers.NginxCache(origin_port, plan["cache_mb"], nofile=nofile)

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
        return nginx_time.timing(self)

    def config_origins(self) -> dict:
        return nginx_time.config_origins(self.lines)

    time_parts = staticmethod(nginx_time.parts)

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

    def cache_dirs(self) -> list[str]:
        statements = (st.split() for ln in self.lines for st in re.split(r"[;{}]", ln.text.split("#", 1)[0]))
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

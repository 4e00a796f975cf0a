"""HAProxy: `haproxy -f CFG` (several -f, or a directory of *.cfg), its
`stats socket` for `show info`, and its caps.

How it counts and refuses (src/listener.c, listener_accept): every accepted
client connection is a session; while actconn >= global.maxconn, or a
frontend's feconn >= its maxconn, the listener is limited (limit_listener)
and no longer polled, so new clients wait in the kernel's accept queue.
A frontend without `maxconn` (nor one in `defaults`) gets the global
maxconn (src/proxy.c). A global maxconn not written is derived from the fd
limit at start (src/haproxy.c, compute_ideal_maxconn: about two fds per
connection, after listeners and three fds per thread). Sessions are read
from `show info` when there is a stats socket, and always from the client
sockets the process holds on its own listening ports (connsample), never
from fds / 2: an idle client holds no server connection.
"""

import os
import re

from pathlib import Path

from proxytune.core import sockets
from proxytune.core.numbers import is_uint, uint

from .base import STATS_SECONDS, Running, Spec, as_int, directives, nofile_now, option, peak, where
from . import haproxy_time
from .cap import Cap
from .launch import Server, dead_resolver, free_port, limited, need, tempdir

SOURCE = "haproxy src/listener.c listener_accept/limit_listener; maxconn in the configuration manual, section 3.2/4.2"
AT_CAP = "it stops polling its listeners, so new clients wait in the kernel's accept queue"


def sections(lines) -> list[dict]:
    """frontend/listen sections: name, file:line, bound ports and maxconn (own or from `defaults`)."""
    out, defaults_maxconn, cur = [], None, None
    for ln in lines:
        code = ln.text.split("#", 1)[0]
        words = code.split()
        if not words:
            continue
        if not ln.text[:1].isspace():
            cur = None
            if words[0] in ("frontend", "listen"):
                cur = {"kind": words[0], "name": words[1] if len(words) > 1 else "?", "file": ln.file,
                       "line": ln.number, "ports": [], "maxconn": defaults_maxconn}
                out.append(cur)
                if words[0] == "listen" and len(words) > 2:
                    cur["ports"] += _ports(words[2])
            elif words[0] == "defaults":
                cur = {"kind": "defaults"}
            continue
        if cur is None:
            continue
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
        return haproxy_time.timing(self)

    def config_origins(self) -> dict:
        return haproxy_time.config_origins(self.lines)

class HAProxy(Spec, process=RunningHAProxy):
    kind, exe_names = "haproxy", ("haproxy",)
    order = 30
    unit, user, package = "haproxy", "haproxy", "haproxy"
    stores = ("cache",)
    store_design = {"cache": "small objects in shared memory only"}

    @staticmethod
    def launch(store, plan, origin_port, nofile, device=None):
        return HAProxyServer(origin_port, cache_mb=min(plan["cache_mb"], 4095), nofile=nofile)

    time_parts = staticmethod(haproxy_time.parts)

    @staticmethod
    def caps(ev: dict) -> list[Cap]:
        p, conns = ev["proxy"], ev.get("conns") or {}
        d, conf = p["directives"], p.get("config")
        slack = max(1, p.get("threads") or 1)      # one session per thread may sit between close and accept
        limit, named, at, estimate = global_maxconn(ev)
        sessions = [v for v in (peak(p, "CurrConns"), conns.get("clients_peak")) if isinstance(v, int)]
        counted = ("sessions: the larger of `show info` CurrConns and the client sockets it holds on its "
                   "listening ports" if peak(p, "CurrConns") is not None else
                   "sessions: the client sockets it holds on its own listening ports (no stats socket)")
        out = []
        if limit:
            out.append(Cap("haproxy-maxconn", "haproxy", "global maxconn", named, limit, at,
                           max(sessions) if sessions else None, counted, max(1, limit - slack), AT_CAP, SOURCE,
                           f"raise {named} in the global section ({at}), e.g. maxconn 60000, and keep the fd limit "
                           "at 2 x maxconn + reserve (profile linux/haproxy: LimitNOFILE 131072); "
                           "net.core.somaxconn or a longer backlog only lengthens the queue in front of a proxy "
                           "that has stopped accepting", estimate=estimate))
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
        v = d.get("maxconn", {}).get("value", "not set")
        return (f"haproxy sizes its fds from `maxconn {v}` ({where(d, 'maxconn', conf)}): keep the hard fd "
                "limit at 2 x maxconn + reserve (profile linux/haproxy: LimitNOFILE 131072); do not set ulimit-n "
                f"below that (ulimit-n now {d.get('ulimit-n', {}).get('value', 'not set')}; {nofile_now(p)})")

    @staticmethod
    def backlog_fix(p: dict) -> str:
        return ("haproxy: `backlog 8192` in the frontend (or `bind … backlog 8192`); without it the frontend's "
                "maxconn is its backlog (src/listener.c listener_backlog), capped by net.core.somaxconn")

    @staticmethod
    def port_fix(p: dict) -> str:
        return ("let haproxy reuse server connections: `http-reuse safe` (or `always`) in the backend or "
                "defaults (HAProxy 2.6 default: safe) with `option http-keep-alive`; or give each server its "
                "own source range: `server … source 127.0.0.2:1025-65000` (one address's ports per server)")


def global_maxconn(ev: dict) -> tuple[int | None, str, str, bool]:
    """(limit, as written, where, estimated): the written maxconn, else what `show info` says haproxy
    derived, else our estimate of haproxy.c compute_ideal_maxconn from its fd limit."""
    p = ev["proxy"]
    d, conf = p["directives"], p.get("config")
    if (v := as_int(d, "maxconn")) is not None:
        return v, f"`maxconn {v}`", where(d, "maxconn", conf), False
    if (v := peak(p, "Maxconn")) is not None:
        return v, f"maxconn (not set: haproxy derived {v} from its fd limit)", f"{conf} (not set)", False
    fds = as_int(d, "ulimit-n") or max((x for pr in (ev.get("procs") or {}).values()
                                        for x in (pr.get("nofile_soft"), pr.get("nofile_hard"))
                                        if isinstance(x, int)), default=None)
    if not fds:
        return None, "maxconn", "not set", True
    threads = p.get("threads") or 1
    listeners = len(ev.get("listeners") or [])
    est = max(100, (fds - listeners - 3 * threads) // 2)
    return est, f"maxconn (not set: derived from its fd limit {fds}, about {est})", f"{conf} (not set)", True


def more_config_files(argv_paths: list[str]) -> list[str]:
    """-f arguments that name a directory stand for its *.cfg files, in name order."""
    out = []
    for path in argv_paths:
        if path.startswith("/") and os.path.isdir(path):
            out += sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".cfg"))
        else:
            out.append(path)
    return out


class HAProxyServer(Server):
    """haproxy -db (foreground) with a global maxconn, a stats socket, and its cache (max_mb > 0)."""

    def __init__(self, origin_port: int, maxconn: int | None = 4096, cache_mb: int = 64, nofile: tuple | None = None,
                 bind: str = "", stats_socket: bool = True, frontend_maxconn: int | None = None,
                 server_maxconn: int | None = None):
        self.exe = need("haproxy", HAProxy.package)
        self.dir, self.port, self.nofile = tempdir("haproxy"), free_port(), nofile
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
        self._launch(limited([self.exe, "-db", "-f", str(self.conf)], self.nofile))
        return self

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
from pathlib import Path

from proxytune.core import procfs, targetread

from .base import LOG_TAIL, Running, Spec, as_int, delta, nofile_now, option, peak, read_config, where
from . import trafficserver_time
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
        return trafficserver_time.timing(self)

    def config_origins(self) -> dict:
        return trafficserver_time.config_origins(self)

class TrafficServer(Spec, process=RunningTrafficServer):
    kind, exe_names = "trafficserver", ("traffic_server",)
    order = 50
    unit, user, package = "trafficserver", "trafficserver", "trafficserver"
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

    time_parts = staticmethod(trafficserver_time.parts)

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

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
import re
from pathlib import Path

from proxytune.core import procfs

from .. import targetread
from ..owncap import Cap
from . import trafficserver_time
from .base import LOG_TAIL, Proxy, as_int, delta, nofile_now, option, peak, read_config, where

THROTTLE = "proxy.config.net.connections_throttle"
SOURCE = ("trafficserver iocore/net/P_UnixNet.h check_net_throttle (NET_THROTTLE_ACCEPT_HEADROOM 1.1); "
          "records.config connections_throttle")
ACCEPT_HEADROOM = 1.1


class TrafficServer(Proxy):
    kind, exe_names = "trafficserver", ("traffic_server",)
    unit, user, package = "trafficserver", "trafficserver", "trafficserver"
    stores = ("file", "raw")
    store_design = {"file": "one large file: its own directory, aggregated writes",
                    "raw": "a raw block device: the same layout with no filesystem"}

    @staticmethod
    @contextlib.contextmanager
    def bench(store, plan, origin_port, nofile):
        """The raw store gets a loop device of its own."""
        from proxytune.microbench import proxyservers
        if store != "raw":
            with proxyservers.TrafficServer(origin_port, cache_mb=plan["cache_mb"], nofile=nofile) as s:
                yield s
            return
        from proxytune.microbench.devices import Sandbox
        with Sandbox() as sb:
            with proxyservers.TrafficServer(origin_port, raw_device=sb.loop(plan["cache_mb"], "ats-raw"),
                                            nofile=nofile) as s:
                yield s

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

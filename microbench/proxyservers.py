"""HAProxy, Varnish, Traffic Server and an nginx proxy_cache on loopback,
each from Debian's package with a generated config in its own temp dir,
in front of an origin on 127.0.0.1 (Squid and the plain nginx live in
servers.py). The same context-manager contract as there: leaving it stops
the server and removes the temp dir, also on Ctrl-C. Every server says
whether a response was a cache hit in an X-Cache header (HAProxy's small
cache, Varnish's VCL, nginx's $upstream_cache_status); Traffic Server
writes a Squid-format access log instead.
"""

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from proxytune.core.errors import ProxytuneError

from .servers import _need, _Server, dead_resolver, free_port

TS_LOG_FORMAT = "%<cqtq> %<ttms> %<chi> %<crc>/%<pssc> %<psql> %<cqhm> %<cquc> %<caun> %<phr>/%<shn> %<psct>"


def _limited(argv: list[str], nofile: tuple | None) -> list[str]:
    """argv started with this (soft, hard) fd limit, as a service's LimitNOFILE would start it."""
    return (["prlimit", f"--nofile={nofile[0]}:{nofile[1]}", "--"] if nofile else []) + argv


def _tempdir(kind: str, owner: str | None = None) -> Path:
    d = Path(tempfile.mkdtemp(prefix=f"proxytune-{kind}-"))
    d.chmod(0o755)                                  # the proxies drop privileges and must reach their files
    if owner and os.geteuid() == 0:
        shutil.chown(d, owner, owner)
    return d


class HAProxy(_Server):
    """haproxy -db (foreground) with a global maxconn, a stats socket, and its cache (max_mb > 0)."""

    def __init__(self, origin_port: int, maxconn: int | None = 4096, cache_mb: int = 64, nofile: tuple | None = None,
                 bind: str = "", stats_socket: bool = True, frontend_maxconn: int | None = None,
                 server_maxconn: int | None = None):
        self.exe = _need("haproxy", "haproxy")
        self.dir, self.port, self.nofile = _tempdir("haproxy"), free_port(), nofile
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
        self._launch(_limited([self.exe, "-db", "-f", str(self.conf)], self.nofile))
        return self


class Varnish(_Server):
    """varnishd -F with one storage (malloc or file), a VCL that sets X-Cache, and optional -p params."""

    def __init__(self, origin_port: int, store: str = "malloc", cache_mb: int = 256, params: dict | None = None,
                 nofile: tuple | None = None):
        if store not in ("malloc", "file"):
            raise ProxytuneError(f"unknown varnish storage {store!r}", "malloc or file")
        self.exe = _need("varnishd", "varnish")
        self.dir, self.port = _tempdir("varnish"), free_port()
        self.workdir = self.dir / "work"
        self.store = store
        self.storage = f"malloc,{cache_mb}m" if store == "malloc" else f"file,{self.dir / 'storage.bin'},{cache_mb}m"
        # idle keep-alive clients are held 2 minutes, as Squid and Traffic Server do (varnishd's default: 5 s)
        self.params, self.nofile = {"timeout_idle": 120, **(params or {})}, nofile
        # varnishd has no DNS client: the backend and -a addresses are IP literals, which getaddrinfo
        # turns into addresses without a lookup (vcl(7) "Backend definition": .host)
        (self.dir / "default.vcl").write_text(
            f'vcl 4.1;\nbackend origin {{ .host = "127.0.0.1"; .port = "{origin_port}"; }}\n'
            'sub vcl_deliver { if (obj.hits > 0) { set resp.http.X-Cache = "HIT"; } '
            'else { set resp.http.X-Cache = "MISS"; } }\n')

    def __enter__(self):
        argv = [self.exe, "-F", "-n", str(self.workdir), "-a", f"127.0.0.1:{self.port}", "-T", "none",
                "-f", str(self.dir / "default.vcl"), "-s", self.storage, "-j", "unix,user=vcache"]
        for k in sorted(self.params, key=lambda k: k != "thread_pool_min"):    # min before max: max >= min
            argv += ["-p", f"{k}={self.params[k]}"]
        self._launch(_limited(argv, self.nofile), timeout=60)
        return self

    def stats(self) -> dict:
        p = subprocess.run([_need("varnishstat", "varnish"), "-n", str(self.workdir), "-1", "-j"],
                           capture_output=True, text=True, timeout=30)
        doc = json.loads(p.stdout) if p.returncode == 0 else {}
        return {k: v.get("value") for k, v in doc.get("counters", {}).items()}


class TrafficServer(_Server):
    """traffic_server (no traffic_manager) from a runroot in a temp dir: records.config, a cache on
    one large file in the temp dir or on a raw block device, a Squid-format ASCII access log and
    the stats_over_http plugin (/_stats) for its own counters."""

    def __init__(self, origin_port: int | None = None, cache_mb: int = 256, raw_device: str | None = None,
                 throttle: int | None = None, records: dict | None = None, nofile: tuple | None = None,
                 stats_plugin: bool = True, remap_to: int | None = None, log_format: str = TS_LOG_FORMAT):
        self.exe = _need("traffic_server", "trafficserver")
        self.dir, self.port = _tempdir("trafficserver", "trafficserver"), free_port()
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
        self._launch(_limited([self.exe, f"--run-root={self.dir / 'runroot.yaml'}"], self.nofile), timeout=90)
        return self

    def log(self, name: str = "access.log") -> str:
        try:
            return (self.dir / "log" / name).read_text(errors="replace")
        except OSError:
            return ""


class NginxCache(_Server):
    """nginx as a caching reverse proxy: proxy_cache on a directory (one file per object)."""

    def __init__(self, origin_port: int, cache_mb: int = 256, workers: int = 1, nofile: tuple | None = None,
                 connections: int = 8192, cache_dir: Path | None = None, listen: str = "backlog=4096"):
        self.exe = _need("nginx", "nginx-light")
        self.dir, self.port = _tempdir("nginxcache", "www-data"), free_port()
        self.cache, self.nofile = (Path(cache_dir) if cache_dir else self.dir / "cache"), nofile
        self.cache.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.cache, "www-data", "www-data")
        (self.dir / "nginx.conf").write_text(
            f"worker_processes {workers};\ndaemon off;\npid {self.dir}/nginx.pid;\nerror_log {self.dir}/error.log;\n"
            f"events {{ worker_connections {connections}; }}\n"
            # as servers.Nginx: nginx resolves through `resolver` only, and here every address is an IP literal
            f"http {{ access_log off; resolver {dead_resolver()};\n"
            f"  proxy_cache_path {self.cache} levels=1:2 keys_zone=c:16m max_size={cache_mb}m "
            f"inactive=1d use_temp_path=off;\n  server {{ listen 127.0.0.1:{self.port} {listen};\n"
            f"    location / {{ proxy_pass http://127.0.0.1:{origin_port}; proxy_cache c; proxy_cache_key $uri; "
            "add_header X-Cache $upstream_cache_status; } } }\n")

    def __enter__(self):
        self._launch(_limited([self.exe, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf")], self.nofile))
        return self

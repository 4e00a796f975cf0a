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

from proxytune.core.errors import ProxytuneError

from .base import Running, Spec, directives, nofile_now, option, peak, where
from . import squid_time
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
        return squid_time.timing(self)

    def config_origins(self) -> dict:
        return squid_time.config_origins(self.lines)

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

    time_parts = staticmethod(squid_time.parts)

    @staticmethod
    def caps(ev: dict) -> list[Cap]:
        p = ev["proxy"]
        d, conf = p["directives"], p.get("config")
        used, most = peak(p, "fds_in_use"), peak(p, "max_fds")
        counted = "Number of file desc currently in use (cache manager)"
        worst = max((ev.get("procs") or {}).values(), key=lambda pr: pr.get("fd_use", 0), default={})
        sampled = max((v.get("fds_peak", 0) for v in ((ev.get("conns") or {}).get("pids") or {}).values()),
                      default=0)
        if not used:
            used, most = max(worst.get("fds_open") or 0, sampled), worst.get("nofile_soft")
            counted = "its open fds in /proc (the cache manager is deferred at the cap)"
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
    def port_fix(p: dict) -> str:
        d, conf = p["directives"], p.get("config")
        v = d.get("server_persistent_connections", {}).get("value", "on (default)")
        return (f"keep server connections open: `server_persistent_connections on` (now {v}, "
                f"{where(d, 'server_persistent_connections', conf)}), and a longer `server_idle_pconn_timeout`")


class SquidServer(Server):
    """Squid in the foreground (-N) with one cache_dir of the given store type (objects on disk
    only with mem_mb=0), an access log to read hits from, and optionally a given fd limit."""

    def __init__(self, store: str = "ufs", cache_mb: int = 100, mem_mb: int = 0, user: str = "proxy",
                 nofile: tuple[int, int] | None = None, cache_dir: Path | None = None,
                 max_filedescriptors: int | None = None, manager: bool = True, accel_to: int | None = None,
                 logformat: str | None = None):
        if store not in ("ufs", "aufs", "diskd", "rock"):
            raise ProxytuneError(f"unknown squid store {store!r}", "ufs, aufs, diskd or rock")
        self.exe = need("squid", Squid.package)
        self.dir = Path(tempfile.mkdtemp(prefix="proxytune-squid-"))
        self.cache = Path(cache_dir) if cache_dir else self.dir / "cache"     # e.g. on a mount of its own
        self.cache.mkdir(exist_ok=True)
        self.port = free_port()
        self.store = store
        self.nofile = nofile            # (soft, hard) to start with, as a service's LimitNOFILE would
        self.grace = 15
        # SIGKILL: its cache dir is deleted next, so a clean shutdown (SIGTERM waits out shutdown_lifetime,
        # SIGINT still writes swap.state: 2-3 s) saves nothing, and its logs were read while it ran
        self.stop_signal = signal.SIGKILL
        levels = "" if store == "rock" else " 16 256"
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
        self._launch(limit + [self.exe, "-N", "-f", str(self.conf)], timeout=60)
        return self

"""Real servers on loopback for benchmarks and tests: nginx (origin, or a
target with its own limits) and Squid (ufs / aufs / rock), each from
Debian's package with a generated config, its own pid file, logs and spool
in a temp dir. A context manager: leaving it stops the server and removes
the temp dir, also on Ctrl-C. Nothing they do leaves the host: each one's
own DNS client is pinned to loopback (tests/test_offhost.py)."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from proxytune.core.errors import ProxytuneError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_resolver() -> str:
    """127.0.0.1:PORT of a UDP port nothing listens on, for the DNS client of every server we start:
    a query it might send is refused on loopback at once, and never reaches the host's resolver."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise ProxytuneError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


def _need(binary: str, package: str) -> str:
    path = shutil.which(binary) or (f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else None)
    if not path:
        raise ProxytuneError(f"{binary} is not installed", f"Debian: apt-get install {package}")
    return path


class _Server:
    """A foreground server process in its own session, with a temp dir; stopped and removed on exit."""
    proc: subprocess.Popen | None = None
    dir: Path
    port: int
    grace: float = 10

    def _launch(self, argv: list[str], timeout: float = 20) -> None:
        # stderr is not read while the server runs: a chatty server must not block on a full pipe
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_port(self.port, timeout)
        except BaseException:
            self.__exit__()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    stop_signal = signal.SIGTERM

    def __exit__(self, *exc):
        _stop(self.proc, self.grace, self.stop_signal)
        shutil.rmtree(self.dir, ignore_errors=True)
        return False


class Nginx(_Server):
    """nginx answering every request itself (`return 200`), or with the given server block body."""

    def __init__(self, workers: int = 1, rlimit_nofile: int | None = None, connections: int = 4096,
                 body: str = 'add_header Cache-Control "max-age=3600"; return 200 "ok\\n";',
                 listen: str = "backlog=4096", stub_status: bool = False, events_include: bool = False,
                 timed_log: bool = False):
        self.exe = _need("nginx", "nginx-light")
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

class Squid(_Server):
    """Squid in the foreground (-N) with one cache_dir of the given store type (objects on disk
    only with mem_mb=0), an access log to read hits from, and optionally a given fd limit."""

    def __init__(self, store: str = "ufs", cache_mb: int = 100, mem_mb: int = 0, user: str = "proxy",
                 nofile: tuple[int, int] | None = None, cache_dir: Path | None = None,
                 max_filedescriptors: int | None = None, manager: bool = True, accel_to: int | None = None,
                 logformat: str | None = None):
        if store not in ("ufs", "aufs", "diskd", "rock"):
            raise ProxytuneError(f"unknown squid store {store!r}", "ufs, aufs, diskd or rock")
        self.exe = _need("squid", "squid")
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


def _stop(proc: subprocess.Popen | None, grace: float, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
    except ProcessLookupError:
        pass


def wrk(url: str, seconds: float, connections: int = 50, threads: int = 2, script: str | None = None) -> dict:
    """Run wrk and return requests, req/s, socket errors and non-2xx counts from its summary
    (wrk takes whole seconds: a fraction would be refused, so it is rounded, to at least 1)."""
    exe = _need("wrk", "wrk")
    argv = [exe, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s"]
    argv += (["-s", script] if script else []) + [url]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    return parse_wrk(p.stdout)


def parse_wrk(out: str) -> dict:
    import re
    r = {"requests": 0, "rps": 0.0, "errors": {}, "non_2xx": 0}
    if m := re.search(r"(\d+) requests in ([\d.]+)(m?s)", out):
        r["requests"] = int(m.group(1))
    if m := re.search(r"Requests/sec:\s+([\d.]+)", out):
        r["rps"] = float(m.group(1))
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        r["errors"] = dict(zip(("connect", "read", "write", "timeout"), map(int, m.groups())))
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        r["non_2xx"] = int(m.group(1))
    r["raw"] = out
    return r

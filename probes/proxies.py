"""What the doctor watches: which proxy a pid is (by its executable), the
config file its command line names, the directives that cap it, and its
own statistics where it has them (HAProxy's stats socket `show info`,
varnishstat, Squid's cache manager, nginx stub_status, Traffic Server's
stats_over_http). One small class per proxy behind one interface:

    target = identify(pid)            # None for a process we do not know
    target.describe()                 # kind, exe, argv, config file, directives
    target.stats()                    # {"available": bool, ...counters}

Everything read here comes from a process we do not trust: every file its
argv or config names is read as that process would read it (targetread:
its credentials, its cwd, regular files only, size-capped), never written,
never followed into a shell; a socket or port is contacted only when the
target holds it, with one fixed request and one total deadline (sockets).
"""

import datetime
import json
import os
import re
import subprocess
import weakref
from pathlib import Path

from proxytune.core import procfs
from proxytune.core.numbers import is_uint, leading_uint as as_number, uint

from . import sockets, targetread

STATS_SECONDS = 3.0             # the whole of one statistics call: connect, ask, every byte of the answer
LOG_TAIL = 4 << 20              # a log's last bytes, for what it said since the proxy started


def argv_of(pid: int) -> list[str]:
    """The command line; nginx's master rewrites it to one string 'nginx: master process ARGV...'."""
    argv = procfs.argv_of(pid) or []
    if len(argv) == 1 and argv[0].startswith("nginx: master process "):
        argv = argv[0].removeprefix("nginx: master process ").split()
    return argv


def option(argv: list[str], *names: str) -> list[str]:
    """Values of an option given as `-f X`, `-fX`, `--name=X` or `--name X`, in order."""
    out = []
    for i, a in enumerate(argv[1:], 1):
        for n in names:
            if a == n and i + 1 < len(argv):
                out.append(argv[i + 1])
            elif n.startswith("--") and a.startswith(n + "="):
                out.append(a[len(n) + 1:])
            elif not n.startswith("--") and a.startswith(n) and len(a) > len(n):
                out.append(a[len(n):])
    return out


def as_numbers(d: dict, keep: tuple[str, ...]) -> dict:
    """The `keep` keys of d whose values are whole ASCII numbers, as ints."""
    return {k: n for k in keep if (n := uint(str(d.get(k, "")).strip())) is not None}


def read_config(pid: int, path: str | None, proc: int | None = None) -> targetread.Read:
    """A file the target names, read as the target would (targetread)."""
    return targetread.read(pid, path, proc=proc)


def directives(text: str | None, names: tuple[str, ...], section: str | None = None) -> dict:
    """First `name value` of each directive (optionally only inside a `section` block), with its line."""
    out: dict = {}
    if not text:
        return out
    current = None
    for n, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        if code.strip() and not line[:1].isspace() and section is not None:
            current = code.split()[0]
        for statement in re.split(r"[;{}]", code):          # nginx: `events { worker_connections 64; }`
            words = statement.split()
            if words and words[0] in names and words[0] not in out and (section is None or current == section):
                out[words[0]] = {"value": " ".join(words[1:]), "line": n}
    return out


def as_int(d: dict, name: str, default: int | None = None) -> int | None:
    """A directive's whole value as a number ('1²' and '10k' are none: the rule then stays silent)."""
    n = uint((d.get(name) or {}).get("value", ""))
    return default if n is None else n


class Proxy:
    kind = "unknown"
    exe_names: tuple[str, ...] = ()

    def __init__(self, pid: int, exe: str, argv: list[str]):
        self.pid, self.exe, self.argv = pid, exe, argv
        self.logs: dict[str, int] = {}           # log path -> its size when first read (the window start)
        self.proc = targetread.open_proc(pid)      # every read is for this process only, never a recycled pid
        if self.proc is not None:
            weakref.finalize(self, os.close, self.proc)
        got = read_config(pid, self.config_arg(), self.proc)
        self.config_path, self.config_text, self.config_unread = got.path, got.text, got.why
        self.conf = self.parse()

    def config_arg(self) -> str | None:
        return None

    def parse(self) -> dict:
        return {}

    def stats(self) -> dict:
        return {"available": False, "reason": f"{self.kind} has no statistics we read"}

    def describe(self) -> dict:
        return {"kind": self.kind, "pid": self.pid, "exe": self.exe, "argv": self.argv[:40],
                "config": self.config_path, "config_read": self.config_text is not None,
                "config_unread": self.config_unread, "directives": self.conf}

    def appended(self, path: str) -> str:
        """What the log at `path` gained in the window: the first call notes its size (the window
        start) and returns nothing; later ones read from there, capped (from 0 if it was rotated)."""
        start = self.logs.get(path)
        if start is None:
            got = targetread.read(self.pid, path, cap=0, proc=self.proc)
            if got.size is not None:
                self.logs[path] = got.size
            return ""
        return targetread.read(self.pid, path, start=start, proc=self.proc).text or ""

    def status_page(self, host_port: str, path: str) -> str:
        """The body of the target's own HTTP status page at host:port, within STATS_SECONDS;
        OSError (with the reason) when the target does not hold that port or does not answer."""
        host, _, port = host_port.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        try:
            if not sockets.holds_tcp(self.pid, host, int(port)):
                raise PermissionError(f"{host_port} is not held by pid {self.pid}: not contacted")
        except ValueError:
            raise OSError(f"{host_port} is no IP address and port") from None
        status, body = sockets.http_get(host, int(port), path, sockets.Deadline(STATS_SECONDS))
        if status != 200:
            raise ConnectionError(f"HTTP status {status}")
        return body


class HAProxy(Proxy):
    kind, exe_names = "haproxy", ("haproxy",)

    def config_arg(self):
        return (option(self.argv, "-f") or ["/etc/haproxy/haproxy.cfg"])[0]

    def parse(self):
        d = directives(self.config_text, ("maxconn", "ulimit-n", "fd-hard-limit", "stats"), section="global")
        if "stats" in d:
            m = re.match(r"socket\s+(\S+)", d["stats"]["value"])
            d["stats socket"] = {"value": m.group(1), "line": d.pop("stats")["line"]} if m else d.pop("stats")
        return d

    def stats(self):
        path = (self.conf.get("stats socket") or {}).get("value")
        if not path or not path.startswith("/"):
            return {"available": False, "reason": "no `stats socket` in the global section"}
        try:
            data = sockets.unix_query(self.pid, path, b"show info\n", sockets.Deadline(STATS_SECONDS))
        except OSError as e:
            return {"available": False, "reason": f"stats socket {path}: {e.strerror or e}"}
        info = dict(l.split(": ", 1) for l in data.decode(errors="replace").splitlines() if ": " in l)
        keep = ("Maxconn", "Hard_maxconn", "CurrConns", "CumConns", "MaxSock", "Ulimit-n", "ConnRate", "Idle_pct")
        return {"available": True, "source": f"show info on {path}",
                **{k: uint(info[k]) for k in keep if is_uint(info.get(k))}}


class Varnish(Proxy):
    kind, exe_names = "varnish", ("varnishd",)
    DEFAULTS = {"thread_pools": 2, "thread_pool_max": 5000, "thread_pool_min": 100, "thread_queue_limit": 20}
    VARNISHSTAT = "/usr/bin/varnishstat"

    def config_arg(self):
        return (option(self.argv, "-f") or ["/etc/varnish/default.vcl"])[0]

    def parse(self):
        params = {}
        for p in option(self.argv, "-p"):
            k, _, v = p.partition("=")
            if k in self.DEFAULTS and is_uint(v):
                params[k] = {"value": v, "line": None, "where": "varnishd command line (-p)"}
        for k, v in self.DEFAULTS.items():
            params.setdefault(k, {"value": str(v), "line": None, "where": "varnishd default"})
        params["-s"] = {"value": ", ".join(option(self.argv, "-s")) or "default", "line": None}
        params["-a"] = {"value": ", ".join(option(self.argv, "-a")) or ":80", "line": None}
        return params

    def workdir(self) -> str | None:
        n = option(self.argv, "-n")
        return n[0] if n and n[0].startswith("/") and not any(ord(c) < 32 for c in n[0]) else None

    def stats(self):
        """varnishstat on the target's shared memory, run with the target's credentials (its -n
        workdir is the target's to name, not root's to open)."""
        exe, creds = self.VARNISHSTAT, targetread.run_as(self.pid)
        if not Path(exe).exists() or creds is None:
            return {"available": False, "reason": "varnishstat is not installed" if creds is not None else "gone"}
        argv = [exe, "-1", "-j"] + (["-n", self.workdir()] if self.workdir() else [])
        try:
            p = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=STATS_SECONDS * 3,
                               cwd="/", **creds)
            doc = json.loads(p.stdout) if p.returncode == 0 else None
            counters = doc.get("counters", doc) if isinstance(doc, dict) else None
        except (subprocess.TimeoutExpired, OSError, ValueError):
            counters = None
        if not isinstance(counters, dict):
            return {"available": False, "reason": "varnishstat could not read the shared memory"}
        keep = ("MAIN.threads", "MAIN.threads_limited", "MAIN.threads_failed", "MAIN.thread_queue_len",
                "MAIN.sess_queued", "MAIN.sess_dropped", "MAIN.sess_conn", "MAIN.sess_fail", "MAIN.client_req")
        return {"available": True, "source": "varnishstat -j",
                **as_numbers({k: (counters.get(k) or {}).get("value") if isinstance(counters.get(k), dict) else None
                              for k in keep}, keep)}


class Squid(Proxy):
    kind, exe_names = "squid", ("squid",)

    def config_arg(self):
        return (option(self.argv, "-f") or ["/etc/squid/squid.conf"])[0]

    def parse(self):
        return directives(self.config_text, ("max_filedescriptors", "http_port", "workers", "cache_dir"))

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


class Nginx(Proxy):
    kind, exe_names = "nginx", ("nginx",)

    def config_arg(self):
        conf = (option(self.argv, "-c") or ["/etc/nginx/nginx.conf"])[0]
        prefix = (option(self.argv, "-p") or [""])[0]
        return conf if conf.startswith("/") or not prefix else str(Path(prefix) / conf)

    def parse(self):
        d = directives(self.config_text, ("worker_connections", "worker_rlimit_nofile", "worker_processes",
                                          "error_log"))
        m = re.search(r"listen\s+([\w.:\[\]]+)[^;]*;(?:(?!server\s*\{).)*?location\s+(\S+)\s*\{\s*stub_status",
                      self.config_text or "", re.S)
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
            out["not_enough_messages"] = self.appended(log).count("worker_connections are not enough")
        return out


class TrafficServer(Proxy):
    kind, exe_names = "trafficserver", ("traffic_server",)

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
        for n, line in enumerate((self.config_text or "").splitlines(), 1):
            w = line.split()
            if len(w) >= 4 and w[0] in ("CONFIG", "LOCAL") and w[1] in (
                    "proxy.config.net.connections_throttle", "proxy.config.net.max_connections_in",
                    "proxy.config.http.server_ports"):
                out[w[1]] = {"value": " ".join(w[3:]), "line": n}
        out.setdefault("proxy.config.net.connections_throttle", {"value": "30000", "line": None,
                                                                   "where": "Traffic Server default"})
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
        return {"available": True, "source": f"stats_over_http 127.0.0.1:{ports[0]}/_stats", **warned,
                **{k.rsplit(".", 1)[1]: n for k in keep if (n := as_number(str(g.get(k)))) is not None}}


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


KINDS = (HAProxy, Varnish, Squid, Nginx, TrafficServer)


def audit_as(target: Proxy | None, profile_ref: str, comm: str) -> tuple[str, str]:
    """(profile, service) for the host audit: a known proxy is audited under its Debian unit name (its
    kind: varnishd's unit is varnish, traffic_server's is trafficserver) and, in place of the generic
    default, its own profile."""
    if target is None:
        return profile_ref, comm
    from proxytune.tune.profile import PROFILES_DIR
    own = f"linux/{target.kind}"
    if profile_ref == "linux/proxy" and (PROFILES_DIR / f"{own}.toml").is_file():
        profile_ref = own
    return profile_ref, target.kind


def identify(pid: int) -> Proxy | None:
    """The proxy running as pid, by the basename of its executable (comm is renamed by some)."""
    exe = procfs.exe_of(pid)
    if exe is None:
        return None
    name = Path(exe.removesuffix(" (deleted)")).name
    for cls in KINDS:
        if name in cls.exe_names:
            return cls(pid, exe, argv_of(pid))
    return None

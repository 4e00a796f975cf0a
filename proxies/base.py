"""What every proxy module shares, in the three roles a proxy plays here:

- `Spec`, what the tool knows of a proxy without any process: how to
  recognise it (`exe_names`), its Debian `unit`, `user` and `package`, its
  profile, its caps as data and its fixes in its own terms (pure functions
  over recorded evidence), the config files it reads on a host (for tune's
  cache-dir detection), and for `bench proxy` its stores, how one is started
  here (`launch`) and the counters it keeps of its own hits and failures.
  The registry (proxies/__init__.py) lists Specs.
- `Running`, one running process of it (`Spec.process`, found by
  `identify`): its command line, its config read as the target would (with
  its includes, each directive kept with its `file:line`), its statistics,
  its own HTTP status page and its own clocks over the doctor's window
  (`timing()`, pieces in proxies/timing.py; `Spec.time_parts` reads them). Everything read there comes from a process
  we do not trust (see core/targetread and core/sockets).
- its bench server (proxies/launch.py `Server`): the proxy started here
  from Debian's package with a generated config, for benchmarks and tests.

A proxy module fills in one of each: a sixth proxy is one module here, one
profile TOML and its tests.
"""

import glob
import os
import re
import weakref
from dataclasses import dataclass
from pathlib import Path

from proxytune.core import procfs, sockets, targetread
from proxytune.core.numbers import uint

STATS_SECONDS = 3.0             # the whole of one statistics call: connect, ask, every byte of the answer
LOG_TAIL = 4 << 20              # a log's last bytes, for what it said since the proxy started
MAX_CONFIG_FILES = 64           # included files read per config: more than any real layout
MAX_INCLUDE_DEPTH = 8


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


@dataclass(frozen=True)
class Line:
    file: str
    number: int
    text: str


def _include_targets(pattern: str, base_dir: str) -> list[str]:
    """The files an include names: a glob, relative to the main config's directory. Only names are
    listed here; every file is then read as the target would read it."""
    if any(ord(c) < 32 for c in pattern):
        return []
    path = pattern if pattern.startswith("/") else os.path.join(base_dir, pattern)
    if not glob.has_magic(path):
        return [path]
    return sorted(glob.glob(path))[:MAX_CONFIG_FILES]


def config_lines(pid: int, path: str | None, proc: int | None, include_re: re.Pattern | None,
                 text: str | None = None) -> tuple[list[Line], list[str]]:
    """Every line of the config and of the files it includes (in place, in order), each with its file
    and line number; and the included files that could not be read (with why)."""
    out, unread, budget = [], [], [MAX_CONFIG_FILES]
    base_dir = os.path.dirname(path or "") or "/"

    def walk(file: str, body: str | None, depth: int) -> None:
        if body is None:
            got = read_config(pid, file, proc)
            if got.text is None:
                unread.append(f"{file}: {got.why}")
                return
            body = got.text
        for n, raw in enumerate(body.splitlines(), 1):
            m = include_re.match(raw) if include_re else None
            if m and depth < MAX_INCLUDE_DEPTH:
                for inc in _include_targets(m.group(1), base_dir):
                    if budget[0] > 0:
                        budget[0] -= 1
                        walk(inc, None, depth + 1)
                continue
            out.append(Line(file, n, raw))

    if path:
        walk(path, text, 0)
    return out, unread


def directives(lines, names: tuple[str, ...], section: str | None = None) -> dict:
    """First `name value` of each directive (optionally only inside a top-level `section`), with its
    file and line. `lines` is config_lines' list, or a text (one file, no includes)."""
    if isinstance(lines, str) or lines is None:
        lines = [Line("", n, t) for n, t in enumerate((lines or "").splitlines(), 1)]
    out: dict = {}
    current = None
    for ln in lines:
        code = ln.text.split("#", 1)[0]
        if code.strip() and not ln.text[:1].isspace() and section is not None:
            current = code.split()[0]
        for statement in re.split(r"[;{}]", code):          # nginx: `events { worker_connections 64; }`
            words = statement.split()
            if words and words[0] in names and words[0] not in out and (section is None or current == section):
                out[words[0]] = {"value": " ".join(words[1:]), "line": ln.number, **({"file": ln.file}
                                                                                    if ln.file else {})}
    return out


def where(d: dict, name: str, conf: str | None) -> str:
    """`file:line` of a directive, or where its value comes from when it is not written anywhere."""
    item = d.get(name) or {}
    if item.get("line"):
        return f"{item.get('file') or conf}:{item['line']}"
    return item.get("where") or (f"{conf} (not set)" if conf else "not set")


def peak(p: dict, key: str) -> int | None:
    """The larger of a statistic read at the window's start and end."""
    vals = [s.get(key) for s in (p.get("stats_before") or {}, p.get("stats_after") or {}) if s.get("available")]
    vals = [v for v in vals if isinstance(v, int)]
    return max(vals) if vals else None


def delta(p: dict, key: str) -> int | None:
    """A statistic's growth over the window (None when either end is missing)."""
    a, b = p.get("stats_before") or {}, p.get("stats_after") or {}
    if not isinstance(a.get(key), int) or not isinstance(b.get(key), int):
        return None
    return b[key] - a[key]


def as_int(d: dict, name: str, default: int | None = None) -> int | None:
    """A directive's whole value as a number ('1²' and '10k' are none: the rule then stays silent)."""
    n = uint((d.get(name) or {}).get("value", ""))
    return default if n is None else n


def nofile_now(p: dict) -> str:
    """The process's fd limit as the fix quotes it: where it comes from on a Debian host."""
    lim = p.get("nofile") or []
    now = f"soft {lim[0]}, hard {lim[1]}" if len(lim) == 2 else "unknown"
    return f"its RLIMIT_NOFILE now: {now} (set by the unit's LimitNOFILE, or the shell's ulimit -n that started it)"


def thread_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{int(pid)}/task"))
    except (OSError, ValueError):
        return 0


class Spec:
    """One proxy kind, as knowledge: subclasses fill in the class attributes and override what applies.
    Never instantiated: the registry holds the classes."""
    kind = "unknown"
    order = 100                                   # its place in `--proxy all` and in detection (lower first)
    exe_names: tuple[str, ...] = ()
    unit = user = package = ""                  # Debian's unit, the user its limits are for, its package
    service_user = ""                             # the user its service starts as, when not `user`
    managers: tuple[str, ...] = ()                # executables that start it as root (core.proxytree)
    worker_thread: str | None = None              # the name of its worker threads, counted in /proc
    host_configs: tuple[str, ...] = ()            # its config files on a host (globs), where tune looks
    epoll: str | None = None                      # how to run its event loop on epoll; None: it does already
    process: type["Running"]                      # its running process: `class Squid(Spec, process=RunningSquid)`

    def __init_subclass__(cls, process: type["Running"] | None = None, **kw):
        super().__init_subclass__(**kw)
        if process is not None:
            cls.process, process.spec = process, cls

    @classmethod
    def profile(cls) -> str:
        return f"linux/{cls.kind}"

    @staticmethod
    def cache_dirs_in(lines: list[Line]) -> list[str]:
        """The cache directories a config (its lines) names."""
        return []

    # ---- `bench proxy`: its stores, how one is started here, what it counts itself there
    stores: tuple[str, ...] = ()
    optional_stores: tuple[str, ...] = ()        # run only when asked for
    store_design: dict[str, str] = {}           # store -> its design in a few words (the storage question)
    device_stores: tuple[str, ...] = ()          # stores that need a block device of their own (given to launch)
    hit_ratio_from: str | None = None             # what `counters` reads; None: the X-Cache headers wrk saw

    @staticmethod
    def launch(store: str, plan: dict, origin_port: int, nofile: tuple | None, device: str | None = None):
        """A context manager: this proxy with `store`, in front of the origin on 127.0.0.1, for
        `bench proxy` (plan: cache_mb, mem_mb); its server has `pid` and `port`."""
        raise NotImplementedError

    @staticmethod
    def counters(server) -> dict | None:
        """{"hits", "misses"} the proxy counted itself so far, or None when we read no such counter."""
        return None

    @staticmethod
    def failures(server) -> dict | None:
        """Failures the proxy counted itself so far (counter -> value), or None when we read none."""
        return None

    # ---- its own clocks over recorded evidence (issue 28; the live side is Running.timing)

    @staticmethod
    def time_parts(p: dict) -> dict:
        """The parts of a request's time this proxy's clocks show (timing.answer), pure over ev["proxy"]."""
        from .timing import nothing
        return nothing("this proxy's own clocks are not read")

    @staticmethod
    def origins(p: dict) -> dict:
        """The config's origins as recorded with the window (pure over ev["proxy"])."""
        got = (p.get("timing") or {}).get("origins")
        return got if isinstance(got, dict) else {}

    # ---- rules over recorded evidence (no live process): see probes/owncap.py

    @staticmethod
    def caps(ev: dict) -> list:
        """This proxy's caps with their usage in the window (proxies.cap.Cap)."""
        return []

    @staticmethod
    def fd_fix(p: dict) -> str | None:
        return None

    @staticmethod
    def backlog_fix(p: dict) -> str | None:
        """Where this proxy sets its listen backlog (the accept queue; the SYN queue is judged against it
        too: inet_csk_reqsk_queue_is_full), capped by net.core.somaxconn."""
        return None

    @staticmethod
    def churn_fix(p: dict) -> str | None:
        """How this proxy stores objects with fewer file creates and unlinks."""
        return None

    @staticmethod
    def disk_fix(p: dict) -> str | None:
        """How this proxy takes its disk waits off its event loop (blocking-disk-io)."""
        return None

    @staticmethod
    def port_fix(p: dict) -> str | None:
        return None


class Running:
    """One running process of a proxy, read as that process would read. Subclasses override what they
    read; their Spec names them (`class Squid(Spec, process=RunningSquid)`) and is their `spec`."""
    spec: type[Spec] = Spec
    include_re: re.Pattern | None = None

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def unit(self) -> str:
        return self.spec.unit

    @property
    def worker_thread(self) -> str | None:
        return self.spec.worker_thread

    def profile(self) -> str:
        return self.spec.profile()

    def __init__(self, pid: int, exe: str, argv: list[str]):
        self.pid, self.exe, self.argv = pid, exe, argv
        self.logs: dict[tuple, int] = {}         # (cursor, log path) -> its size when the cursor was set
        self.proc = targetread.open_proc(pid)      # every read is for this process only, never a recycled pid
        if self.proc is not None:
            weakref.finalize(self, os.close, self.proc)
        got = read_config(pid, self.config_arg(), self.proc)
        self.config_path, self.config_text, self.config_unread = got.path, got.text, got.why
        self.lines, self.includes_unread = (config_lines(pid, got.path, self.proc, self.include_re, got.text)
                                            if got.text is not None else ([], []))
        for more in self.more_configs()[:MAX_CONFIG_FILES]:
            lines, unread = config_lines(pid, more, self.proc, self.include_re)
            self.lines += lines
            self.includes_unread += unread
        self.conf = self.parse()

    def config_arg(self) -> str | None:
        return None

    def more_configs(self) -> list[str]:
        """Config files read after the main one (haproxy's further -f)."""
        return []

    def parse(self) -> dict:
        return {}

    def processes(self) -> list[int]:
        """The pids that hold this proxy's connections (a master's workers too)."""
        return [p for p in procfs.descendants(self.pid) if p == self.pid or procfs.exe_of(p) == self.exe]

    def stats(self) -> dict:
        return {"available": False, "reason": f"{self.kind} has no statistics we read"}

    def describe(self) -> dict:
        return {"kind": self.kind, "pid": self.pid, "exe": self.exe, "argv": self.argv[:40],
                "config": self.config_path, "config_read": self.config_text is not None,
                "config_unread": self.config_unread, "includes_unread": self.includes_unread[:20],
                "config_files": sorted({ln.file for ln in self.lines})[:MAX_CONFIG_FILES],
                "threads": thread_count(self.pid), "nofile": list(procfs.nofile_limits(self.pid) or []),
                "directives": self.conf}

    def appended(self, path: str, window: bool = False) -> str:
        """What the log at `path` gained: the first call notes its size and returns nothing; later ones
        read from there, capped (from 0 if it was rotated). A count read so (the stats' error-log lines)
        grows from the first call; window=True is a window's own cursor instead, moved to the end at
        each call, so a standing session's windows each read only their own lines."""
        key = ("window" if window else "since first", path)
        start = self.logs.get(key)
        got = targetread.read(self.pid, path, start=start or 0, cap=0 if start is None else targetread.MAX_BYTES,
                              proc=self.proc)
        if got.size is not None and (start is None or window):
            self.logs[key] = got.size
        return "" if start is None else (got.text or "")

    def status_page(self, host_port: str, path: str) -> str:
        """The body of the target's own HTTP status page at host:port, within STATS_SECONDS;
        OSError (with the reason) when the target does not hold that port or does not answer."""
        host, _, port = host_port.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        host = {"localhost": "127.0.0.1", "*": "127.0.0.1"}.get(host, host)     # never a resolver lookup
        try:
            if not sockets.holds_tcp(self.pid, host, int(port), self.proc):
                raise PermissionError(f"{host_port} is not held by pid {self.pid}: not contacted")
        except ValueError:
            raise OSError(f"{host_port} is no IP address and port") from None
        status, body = sockets.http_get(host, int(port), path, sockets.Deadline(STATS_SECONDS))
        if status != 200:
            raise ConnectionError(f"HTTP status {status}")
        return body

    def cache_dirs(self) -> list[str]:
        """The cache directories its config names (read as the proxy read it)."""
        return self.spec.cache_dirs_in(self.lines)

    # ---- its own clocks (issue 28): read live around the doctor's window (see timing.py)

    def timing(self):
        """A context manager around the doctor's window reading this proxy's own clocks; its
        `.result()` goes into the evidence as ev["proxy"]["timing"] (Spec.time_parts reads it)."""
        from .timing import Unavailable
        return Unavailable(self, f"{self.kind}: no clock of its own is read")

    def config_origins(self) -> dict:
        """{"IP:PORT": {"name", "where"}} for every origin the config names by address (never resolved)."""
        return {}

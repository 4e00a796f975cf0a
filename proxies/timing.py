"""A proxy's own clocks over the doctor's window (issue 28): the shared
pieces of every proxy module's clocks, `Running.timing()` (read live,
around the window) and `Spec.time_parts()` (pure, over the recorded
evidence). What each proxy's clocks are lives in its own module.

The parts and the part dict are the budget's (notes/budget-interface.md,
probes/budget.py): `proxy_queue`, `origin_connect`, `origin_first_byte`
and `proxy_total` (the proxy's own total per request, for the
cross-check). A part's `ms` is the mean per client request in the window
(a cache hit adds 0 to the origin's parts), so the parts of one request add
up; `share` says which fraction of the requests reached that stage, and
`by_origin` gives each origin's mean over its own requests. A part the
proxy cannot show is `measurable: False` with why, never 0.

Everything a proxy says is untrusted: numbers are ASCII decimals, lists
and lines are capped, every co-process has a byte cap and a deadline and
runs with the target's credentials (targetread.run_as).
"""

import ipaddress
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass

PARTS = ("proxy_queue", "origin_connect", "origin_first_byte", "proxy_total")
MAX_VALUES = 50_000             # per-request values kept per part in one window
MAX_LINE = 8192                 # a log line longer than this is no line of a known format
MAX_ORIGINS = 64                # origins listed per part
DECIMAL = re.compile(r"-?[0-9]{1,15}(?:\.[0-9]{1,9})?", re.A)


def decimal(text) -> float | None:
    """The number `text` is when it is an ASCII decimal ('0.300', '-1', '12'); None otherwise."""
    return float(text) if isinstance(text, str) and DECIMAL.fullmatch(text) else None


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of a sorted, non-empty list."""
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.999999) - 1))]


def spread(values: list[float]) -> dict:
    """mean, p50, p99 and count of per-request values (ms)."""
    if not values:
        return {"mean": None, "p50": None, "p99": None, "n": 0}
    ordered = sorted(values)
    return {"mean": sum(ordered) / len(ordered), "p50": percentile(ordered, 0.5),
            "p99": percentile(ordered, 0.99), "n": len(ordered)}


def digest(values: list[float]) -> dict:
    """What a window keeps of per-request values: count, sum and percentiles (not every value)."""
    s = spread(values)
    return {"n": s["n"], "sum_ms": round(sum(values), 3), "p50": s["p50"], "p99": s["p99"]}


def part(ms: float | None, mechanism: str, precision: str, *, samples: int | None = None,
         requests: int | None = None, population: str = "every request", p50: float | None = None,
         p99: float | None = None, by_origin: dict | None = None, cause: dict | None = None,
         check: dict | None = None, overlaps: str | None = None, overlap_ms: float | None = None,
         uncertainty_ms: float | None = None) -> dict:
    """One measured part (the budget's part dict): `ms` is the mean over its population, `requests` how
    many of the window's requests that population holds."""
    if ms is None:
        return unmeasurable(precision, mechanism)
    out = {"ms": _r(ms), "p50_ms": _r(p50), "p99_ms": _r(p99), "samples": samples, "requests": requests,
           "population": population, "mechanism": mechanism, "precision": precision, "measurable": True,
           "why": None}
    if uncertainty_ms is not None:
        out["uncertainty_ms"] = _r(uncertainty_ms)       # the half-width the precision states, as a number
    if by_origin:
        out["by_origin"] = dict(sorted(by_origin.items(), key=lambda kv: -(kv[1].get("ms") or 0))[:MAX_ORIGINS])
    if cause:
        out["cause"] = cause
    if check:
        out["check"] = check
    if overlaps:
        out["overlaps"] = overlaps          # what else measures the same wait (the budget adds it once)
        out["overlap_ms"] = _r(ms if overlap_ms is None else overlap_ms)     # how much of this part that is
    return out


def unmeasurable(why: str, mechanism: str = "") -> dict:
    return {"ms": None, "p50_ms": None, "p99_ms": None, "samples": None, "requests": None, "population": None,
            "mechanism": mechanism, "precision": "", "measurable": False, "why": why}


def answer(parts: dict, total: dict | None, n: int | None, source: str) -> dict:
    """What time_parts returns: the parts, the proxy's own total, the window's requests by its count."""
    return {"parts": {k: v for k, v in parts.items() if k in PARTS and k != "proxy_total"},
            "proxy_total": total, "requests": {"n": n, "source": source}}


def nothing(why: str, mechanism: str = "") -> dict:
    """No clock read in this window: every part not measurable, for one reason."""
    return answer({name: unmeasurable(why, mechanism) for name in PARTS}, unmeasurable(why, mechanism), None, why)


def _r(v: float | None) -> float | None:
    return None if v is None else round(float(v), 3)


def origin_entry(name: str, where: str | None, ms: float | None, requests: int | None) -> dict:
    return {"name": name, "where": where, "ms": _r(ms), "requests": requests}


def address(host: str, port) -> str | None:
    """'IP:PORT' as Python formats it ('[::1]:80' for IPv6); None for a name (never resolved) or junk."""
    try:
        ip = ipaddress.ip_address(str(host).strip("[]"))
        port = int(port)
    except (ValueError, TypeError):
        return None
    if not 0 < port < 65536:
        return None
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def split_address(text: str) -> str | None:
    """'IP:PORT' from '127.0.0.1:8080' or '[::1]:8080' (normalised), else None."""
    host, _, port = (text or "").strip().rpartition(":")
    return address(host, port) if host else None


# ---------------------------------------------------------------- the live side: one window

class Window:
    """The context manager `timing()` returns: `begin()` when the doctor's window starts, `end()`
    when it ends, `.result()` the JSON-able record stored as ev["proxy"]["timing"]. A failure in
    either is recorded in the result (why), never raised into the doctor."""
    source = ""

    def __init__(self, proxy):
        self.proxy = proxy
        self.t0 = self.t1 = None
        self.errors: list[str] = []
        self.data: dict = {"origins": config_origins(proxy)}      # from the config: named even when unread

    def begin(self) -> None:
        """Read what the window starts from."""

    def end(self) -> None:
        """Read what the window ends with."""

    def __enter__(self):
        self.t0 = time.monotonic()
        self._guarded(self.begin)
        return self

    def __exit__(self, *exc):
        self.t1 = time.monotonic()
        self._guarded(self.end)
        return False

    def _guarded(self, step) -> None:
        try:
            step()
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            self.errors.append(f"{type(e).__name__}: {e}"[:300])

    def result(self) -> dict:
        window = round(self.t1 - self.t0, 3) if self.t0 is not None and self.t1 is not None else None
        return {"available": not self.data.get("unavailable"), "source": self.source,
                "window_s": window, "errors": self.errors[:10], **self.data}


def config_origins(proxy) -> dict:
    """The origins the proxy's config names ({"IP:PORT": {"name", "where"}}), pure over its lines."""
    try:
        return dict(list(proxy.config_origins().items())[:MAX_ORIGINS])
    except (ValueError, KeyError, AttributeError, TypeError):
        return {}


class Unavailable(Window):
    """A proxy (or a config) with no clock of its own to read: says why."""

    def __init__(self, proxy, why: str):
        super().__init__(proxy)
        self.data.update({"unavailable": True, "reason": why})

    def result(self) -> dict:
        return {**super().result(), "available": False}


class Sampler:
    """Calls `fn` every `every` seconds on a thread of its own between start() and stop() (at most
    `most` times): a gauge the proxy updates itself (a queue length) read across the window."""

    def __init__(self, fn, every: float, most: int = 64):
        self.fn, self.every, self.most = fn, every, most
        self.values: list = []
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="timing-sampler")

    def _run(self) -> None:
        while not self.stop_ev.wait(self.every) and len(self.values) < self.most:
            try:
                self.values.append(self.fn())
            except (OSError, ValueError, subprocess.SubprocessError):
                continue

    def start(self) -> "Sampler":
        self.thread.start()
        return self

    def stop(self) -> list:
        self.stop_ev.set()
        self.thread.join(10)
        return list(self.values)


class CoProcess:
    """A reader the proxy ships (varnishlog) run with the target's credentials for the window: its
    stdout is collected on a thread up to `cap` bytes (beyond: the rest is dropped and `truncated`
    says so), and stop() ends it within `grace` seconds (SIGTERM, then SIGKILL)."""

    def __init__(self, argv: list[str], creds: dict, cap: int, grace: float = 2.0):
        self.cap, self.grace = cap, grace
        self.chunks: list[bytes] = []
        self.size, self.truncated, self.used_cpu_s = 0, False, None
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd="/", start_new_session=True, **creds)
        self.thread = threading.Thread(target=self._read, daemon=True, name="timing-coprocess")
        self.thread.start()

    def _read(self) -> None:
        out = self.proc.stdout
        while block := out.read1(1 << 16):
            if self.size + len(block) > self.cap:
                self.chunks.append(block[:self.cap - self.size])
                self.size, self.truncated = self.cap, True
                break
            self.chunks.append(block)
            self.size += len(block)

    def cpu_s(self) -> float | None:
        """The CPU time the reader used so far (utime + stime of /proc/PID/stat): the doctor's own cost."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> str:
        self.used_cpu_s = self.cpu_s() if self.proc.poll() is None else None
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(self.grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.thread.join(self.grace)
        self.proc.stdout.close()
        return b"".join(self.chunks).decode(errors="replace")


# ---------------------------------------------------------------- log formats

@dataclass(frozen=True)
class LineFormat:
    rx: re.Pattern
    groups: dict                    # field name -> the group of its first occurrence


def template_regex(tokens: list[tuple[str, str]], listed: frozenset = frozenset()) -> LineFormat | None:
    """A regex for a log line written by a format, from its tokens: ("lit", text) or ("field", name).
    Each field matches up to the first character of the literal after it (a field's value cannot hold
    the character that ends it: nginx escapes `"` in `"$request"`), the last one to the end of the
    line; spaces in literals match runs of spaces (squid pads %6tr). Possessive quantifiers only: a
    hostile line cannot make it backtrack. A `listed` field may hold a list joined by ", " or " : " (nginx's
    $upstream_* for several upstreams or redirects). None for a format with two fields side by side (no way
    to tell where one ends)."""
    out, names, seen = ["^"], [], {}
    for i, (kind, text) in enumerate(tokens):
        if kind == "lit":
            out.append(" ++".join(re.escape(piece) for piece in text.split(" ")))
            continue
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if nxt is not None and nxt[0] != "lit":
            return None
        group = f"f{len(names)}"
        names.append(text)
        seen.setdefault(text, group)
        stop = nxt[1][0] if nxt else None
        pad = " *+" if i == 0 else ""
        joins = ", | : |" if text in listed else ""
        out.append(pad + (r"(?P<%s>(?:%s[^%s])*+)" % (group, joins, re.escape(stop)) if stop else
                          r"(?P<%s>.*)" % group))
    try:
        return LineFormat(re.compile("".join(out) + "$"), seen)
    except re.error:
        return None


def parse_line(fmt: LineFormat, line: str) -> dict | None:
    """The fields of one log line by name (the first of repeated ones), or None when it is not one."""
    if len(line) > MAX_LINE:
        return None
    m = fmt.rx.match(line)
    if not m:
        return None
    return {name: m.group(group) for name, group in fmt.groups.items()}


def timed_lines(text: str, fmt: LineFormat, key: str) -> tuple[list[tuple[dict, float]], int]:
    """The lines of a log (at most MAX_VALUES) that parse with a number in field `key`, as (fields,
    that number); and how many did not."""
    out, unread = [], 0
    for line in text.splitlines()[:MAX_VALUES]:
        f = parse_line(fmt, line)
        v = decimal(f.get(key)) if f else None
        if v is None:
            unread += 1
        else:
            out.append((f, v))
    return out, unread

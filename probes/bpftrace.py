"""The bpftrace catalog: every probes/*.bt script, its header, the
tracepoints it needs; composing several into one program filtered by a set
of pids; running it for a window and reading its JSON output.

Each script filters with `pid == $1` (the process) or `tid == $1` (its
event-loop thread, the main thread; `args->prev_pid == $1` or
`args->next_pid == $1` where a tracepoint names it: a field of the record
is cheaper than the helper call behind pid and tid), so it also runs standalone as
`bpftrace probes/NAME.bt PID`. Composing rewrites those predicates for a
list of pids (nginx has one worker process per core) and merges END blocks
(bpftrace allows one).
"""

import json
import math
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from proxytune.tune.datafiles import shipped
from proxytune.core.errors import ProxytuneError
from proxytune.core.invocation import command

from proxytune.core import procfs, procgroup

from . import bpfstats, target

HERE = shipped("probes")
TRACING = Path("/sys/kernel/tracing")
END_RE = re.compile(r"^END\s*\{(.*)\}\s*$", re.M)
# Detaching a few dozen tracepoints takes bpftrace a second or two; on a loaded host far longer.
STOP_GRACE_S = 60.0
# How long after attached_probes its tracepoints may take to carry their programs (a loaded host).
ATTACH_WAIT_S = 10.0
# Before attached_probes: a bpftrace that used no CPU this long is stuck; one that keeps compiling gets
# ATTACH_MAX_S in all (its few CPU-seconds stretch on a saturated host).
ATTACH_STALL_S = 30.0
ATTACH_MAX_S = 180.0
# Until it exits, bpftrace gets a SIGTERM this often after the first SIGINT (see procgroup.stop).
NUDGE_S = 1.0
# `X == $1`, where X is pid, tid or a tracepoint field (args->next_pid): compose() matches any of the pids.
PID_ARG = re.compile(r"(?<![\w>])((?:args->)?[a-z_]+) == \$1\b")
# `X == $2` in a script that takes the proxy's listening ports (budget.bt): any of them; `$3` its netns inode.
# scripts whose `!(X == $2)` would hold for every socket without the ports: composed only with them
NEEDS_PORTS = ("origin_wait",)
PORT_ARG = re.compile(r"(?<![\w>])((?:args->|\$)?[a-z_]+) == \$2\b")
NETNS_ARG = re.compile(r"\$3\b")
MAP_NAME = re.compile(r"@\w+")
CLEARED = re.compile(r"clear\((@\w+)\)")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\])*"')
# What a standing program prints after each window's maps (a printf line in -f json): the window's end.
WINDOW_MARK = "proxytune-window-end"


@dataclass
class Script:
    name: str
    path: Path
    purpose: str
    header: str
    text: str
    tracepoints: list[str] = field(default_factory=list)


def catalog() -> dict[str, Script]:
    out = {}
    for path in sorted(HERE.glob("*.bt")):
        text = path.read_text()
        header = text[text.index("/*") + 2:text.index("*/")] if "/*" in text else ""
        lines = [l.strip(" *") for l in header.splitlines() if l.strip(" *")]
        purpose = lines[0].split(None, 1)[1] if lines and " " in lines[0] else path.stem
        tps = sorted(set(re.findall(r"tracepoint:(\w+:\w+)", text.split("*/", 1)[-1])))
        out[path.stem] = Script(path.stem, path, purpose, "\n".join(lines), text, tps)
    return out


def named(name: str) -> Script:
    """The catalog's script of that name; an error naming the known ones otherwise."""
    cat = catalog()
    if name not in cat:
        raise ProxytuneError(f"no probe named {name!r}", f"known: {', '.join(cat)}")
    return cat[name]


def listing() -> list[dict]:
    """`probe list --json`: every script's name, file, purpose and tracepoints."""
    return [{"name": s.name, "path": str(s.path), "purpose": s.purpose, "tracepoints": s.tracepoints}
            for s in catalog().values()]


def tracepoint_exists(tp: str) -> bool:
    """Whether the kernel has tracepoint CAT:NAME. An unreadable tracefs says nothing about that:
    an error (see caps.require_tracefs), never 'missing'."""
    cat, name = tp.split(":")
    try:
        return (TRACING / "events" / cat / name / "format").exists()
    except PermissionError:
        raise ProxytuneError(f"cannot tell whether tracepoint {tp} exists: {TRACING} is not readable",
                             f"tracefs is readable by root only; see {command('probe caps')}") from None


BTF = Path("/sys/kernel/btf/vmlinux")
STRUCT_CAST = re.compile(r"\(struct \w+ \*\)")


PROBE_HEAD = re.compile(r"^tracepoint:", re.M)
ARG_FIELD = re.compile(r"args->(\w+)")
FORMAT_FIELD = re.compile(r"field:[^;]*?(\w+)(?:\[\d*\])?;")


def tracepoint_fields(tp: str) -> set[str]:
    """The fields a tracepoint's record has on this kernel (events/CAT/NAME/format): they change between
    kernels (tcp:tcp_probe gained skaddr after 6.8)."""
    cat, name = tp.split(":")
    try:
        return set(FORMAT_FIELD.findall((TRACING / "events" / cat / name / "format").read_text()))
    except OSError:
        return set()


def missing_fields(s: Script) -> list[str]:
    """The `args->FIELD`s s reads that this kernel's tracepoints lack: bpftrace refuses the whole program
    for one of them, and the doctor composes one program of every script."""
    out = []
    for head, block in probe_blocks(COMMENT.sub("", s.text)):
        used = list(dict.fromkeys(ARG_FIELD.findall(block)))
        for tp in re.findall(r"tracepoint:(\w+:\w+)", head):
            have = tracepoint_fields(tp)
            out += [f"{tp} field {f}" for f in used if have and f not in have]
    return list(dict.fromkeys(out))


def probe_blocks(body: str) -> list[tuple[str, str]]:
    """(its tracepoints, its predicate and braced body) of each tracepoint probe block of a script: the
    head runs to the predicate or the first brace, the body to the brace that balances it."""
    out = []
    for m in PROBE_HEAD.finditer(body):
        opening = body.find("{", m.start())
        if opening < 0:
            break
        pred = body.find("/", m.start(), opening)
        depth, i = 0, opening
        for i in range(opening, len(body)):
            depth += {"{": 1, "}": -1}.get(body[i], 0)
            if depth == 0:
                break
        head_end = pred if pred >= 0 else opening
        out.append((body[m.start():head_end], body[head_end:i + 1]))
    return out


def missing_tracepoints(s: Script) -> list[str]:
    """The tracepoints s needs that this kernel lacks (or the fields it reads of them), and its BTF when s
    reads a kernel struct (a cast such as `(struct sock *)args->skaddr` is resolved through BTF: without it
    the program does not load)."""
    missing = [tp for tp in s.tracepoints if not tracepoint_exists(tp)]
    if not missing:
        missing = missing_fields(s)
    if STRUCT_CAST.search(s.text.split("*/", 1)[-1]) and not BTF.exists():
        missing.append(f"kernel BTF ({BTF})")
    return missing


def _any_of(var: str, ids: list[int]) -> str:
    return "(" + " || ".join(f"{var} == {i}" for i in ids) + ")" if len(ids) > 1 else f"{var} == {ids[0]}"


def compose(scripts: list[Script], pids: list[int], args: dict[str, dict] | None = None,
            dump_every_ms: int | None = None) -> str:
    """One program from several scripts, for these pids (each pid's main thread is its loop thread).
    `args` gives a script, by name, its own positional values: "pids" (e.g. every process of a proxy,
    not only the watched ones), "ports" for `== $2` (none: a port no socket has) and "netns" for `$3`.
    With `dump_every_ms` the program stands: it prints and clears its maps every window (window_dump)."""
    if not pids:
        raise ProxytuneError("no process to probe")
    body, ends = [], []
    for s in scripts:
        own = (args or {}).get(s.name, {})
        text = s.text
        ends += [m.strip() for m in END_RE.findall(text)]
        text = END_RE.sub("", text)
        text = PID_ARG.sub(lambda m: _any_of(m.group(1), own.get("pids") or pids), text)
        if s.name in NEEDS_PORTS and not own.get("ports"):
            raise ProxytuneError(f"{s.name} needs the proxy's listening ports",
                                 "without them every socket of the proxy would count as an upstream one")
        text = PORT_ARG.sub(lambda m: _any_of(m.group(1), [int(p) for p in own.get("ports") or [0]]), text)
        text = NETNS_ARG.sub(str(int(own.get("netns") or 0)), text)
        text = "\n".join(l for l in text.splitlines() if not l.startswith("#!"))
        body.append(f"/* ---- {s.name} ---- */\n{text}")
    if dump_every_ms:
        body.append(window_dump(output_maps("\n".join(body), ends), dump_every_ms))
    if ends:
        body.append("END { " + " ".join(ends) + " }")
    return "\n".join(body) + "\n"


def output_maps(body: str, ends: list[str]) -> list[str]:
    """The maps bpftrace prints at exit: every @map the program names, less those its END blocks clear
    (each script's own bookkeeping, such as a thread's start time; comments and strings are no names)."""
    code = STRING.sub('""', COMMENT.sub("", body))
    bookkeeping = {m for e in ends for m in CLEARED.findall(e)}
    return [m for m in dict.fromkeys(MAP_NAME.findall(code)) if m not in bookkeeping]


def window_dump(maps: list[str], every_ms: int) -> str:
    """A probe that, every `every_ms`, prints the output maps as bpftrace prints them at exit, clears
    them (so each dump is one window's counts) and marks the window's end. bpftrace 0.17 has no
    print-on-signal (SIGUSR1 ends it), so the program's own interval closes the windows."""
    if not maps:
        raise ProxytuneError("a standing program needs at least one output map")
    prints = " ".join(f"print({m});" for m in maps)
    clears = " ".join(f"clear({m});" for m in maps)
    return f"interval:ms:{int(every_ms)} {{ {prints} {clears} printf(\"{WINDOW_MARK}\\n\"); }}"


def parse_output(stdout: str) -> dict:
    """bpftrace -f json lines -> {"@map": value}; hist -> [{min,max,count}], stats -> {count,average,total}."""
    maps: dict = {}
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("type") in ("map", "hist", "stats", "lhist"):
            maps.update(msg["data"])
    return maps


def merge_maps(a: dict, b: dict) -> dict:
    """Two consecutive windows' maps as one window's: every output map is a count, a sum, a hist or
    stats (output_maps(); test_bpftrace_standing checks the catalog), and each of those adds."""
    out = dict(a)
    for name, value in b.items():
        out[name] = _added(out[name], value) if name in out else value
    return out


def _added(x, y):
    if isinstance(x, dict) and {"count", "total"} <= x.keys() and isinstance(y, dict):     # stats
        count, total = x["count"] + y["count"], x["total"] + y["total"]
        return {**x, "count": count, "total": total, "average": total // count if count else 0}
    if isinstance(x, dict) and isinstance(y, dict):                                       # keyed
        return merge_maps(x, y)
    if isinstance(x, list) and isinstance(y, list):                                       # hist buckets
        buckets = {}
        for b in x + y:
            key = (b.get("min"), b.get("max"))
            buckets[key] = {**b, "count": buckets.get(key, {}).get("count", 0) + b.get("count", 0)}
        return sorted(buckets.values(), key=lambda b: -math.inf if b.get("min") is None else b["min"])
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        return x + y
    raise TypeError(f"a map of two shapes: {type(x).__name__} and {type(y).__name__}")


class Run:
    """A bpftrace program running in the background; stop() returns its maps."""

    def __init__(self, kids: procgroup.Children, program: str):
        if not shutil.which("bpftrace"):
            raise ProxytuneError("bpftrace is not installed", "Debian: apt-get install bpftrace")
        self.file = kids.dir / "program.bt"             # the run's private dir: removed with the tracers
        self.file.write_text(program)
        self.program = program
        self.started = None
        self.proc = kids.start(["bpftrace", "-f", "json", str(self.file)])

    def wait_attached(self, timeout: float = ATTACH_STALL_S) -> None:
        """bpftrace prints attached_probes once every probe is attached: the window starts then.
        A watchdog kills a bpftrace that is stuck: one that has used no CPU for `timeout` seconds
        before saying so (a blocking readline alone would wait as long as a stuck compile lasts). A
        compile that keeps using CPU goes on, up to ATTACH_MAX_S in all: on a saturated host (the
        host a doctor is called to) the same compile takes several times its few CPU-seconds of wall
        time, and a wall-clock deadline killed a compile that was progressing (CI, 2026-11-27)."""
        done, why = threading.Event(), []                 # why: the watchdog's reason, once it killed bpftrace
        watchdog = threading.Thread(target=self._watch_attach, args=(timeout, done, why), daemon=True)
        watchdog.start()
        try:
            for line in iter(self.proc.stdout.readline, ""):
                if '"attached_probes"' in line:
                    break
            else:
                line = ""
        finally:
            done.set()
            watchdog.join()             # a kill already under way finishes before `why` is read
        if line and not why:
            # bpftrace 0.17 prints it before it attaches: wait until the kernel holds a program
            # on each tracepoint (bpfstats reads that from /proc), or ATTACH_WAIT_S at most
            bpfstats.wait_attached(self.proc.pid, len(re.findall(r"tracepoint:\w+:\w+", self.program)),
                                   ATTACH_WAIT_S)
            self.started = time.monotonic()
            return
        procgroup.kill(self.proc)
        err = _clean(self.proc.stderr.read())[-300:]
        msg = (why[0] + (f": {err}" if err else "")) if why else (err or "it exited without a word")
        raise ProxytuneError(f"bpftrace did not attach: {msg}")

    def _watch_attach(self, stall_s: float, done: threading.Event, why: list) -> None:
        """Kill bpftrace when it used no CPU for stall_s, or when ATTACH_MAX_S have passed; `why` says
        which, with its CPU time, its state and where in the kernel it waits (for the next report)."""
        limit = max(ATTACH_MAX_S, stall_s)
        t0 = last_t = time.monotonic()
        last_cpu = procfs.cpu_seconds(self.proc.pid) or 0.0
        while not done.wait(min(1.0, stall_s / 2)):
            now, cpu = time.monotonic(), procfs.cpu_seconds(self.proc.pid)
            if cpu is not None and cpu > last_cpu:
                last_cpu, last_t = cpu, now
            stalled = now - last_t >= stall_s
            if stalled or now - t0 >= limit:
                what = f"timed out after {stall_s:g} s without progress" if stalled else f"timed out after {limit:g} s"
                why.append(f"{what} ({_where(self.proc.pid, last_cpu, now - t0)})")
                procgroup.kill(self.proc)
                return

    def stop(self, need_maps: bool = True) -> dict:
        """bpftrace detaches and prints its maps. If it was killed or failed, it printed none (or
        part), and an empty window would read as 'nothing seen': with need_maps that is an error."""
        out, err = procgroup.stop(self.proc, grace=STOP_GRACE_S, nudge=(signal.SIGTERM, NUDGE_S))
        rc = self.proc.returncode
        if need_maps and rc != 0:
            why = (f"did not print its maps within {STOP_GRACE_S:g} s of SIGINT and was killed" if rc == -signal.SIGKILL
                   else f"exited with {rc} ({_clean(err)[-200:] or 'no message'})")
            raise ProxytuneError(f"bpftrace {why}: this window's counts are lost", "run again on a less loaded host")
        maps = parse_output(out)
        maps["_window_s"] = time.monotonic() - self.started if self.started else 0.0
        maps["_stderr"] = _clean(err)
        return maps


class Standing:
    """A standing program (compose(..., dump_every_ms)) that stays attached across windows: the
    watcher's probes, attached once instead of once per window (bpftrace's compile and attach cost
    seconds of CPU). Two threads drain its stdout and stderr, so a pipe never fills; each window's
    dump is queued whole at its mark. Windows are the program's own interval, so consecutive ones
    neither overlap nor leave a gap between them. print() and clear() are done by bpftrace's user side
    as it reads its perf buffer: if the host stalls it, a dump holds the longer span since the last one,
    and _window_s (timed at the mark's arrival) is that span, so rates stay right. The intervals that
    fired during the stall are then read at once: their dumps come a moment after that one, with a few
    ms of counts each. A dump that comes less than half an `interval_s` after the last is held and added
    to the next (merge_maps), so no window is a few ms long (counts over ms read as huge rates)."""

    STDERR_KEPT = 4096
    SHORTEST = 0.5                                       # of the interval: a shorter window joins the next

    def __init__(self, run: Run, interval_s: float | None = None, clock=time.monotonic):
        self.proc = run.proc
        self.windows: queue.Queue = queue.Queue()
        self.err = ""
        self.clock = clock
        self.failed = ""
        self.shortest = interval_s * self.SHORTEST if interval_s else 0.0
        self.last = run.started if run.started is not None else clock()
        self.threads = [threading.Thread(target=self._read_out, daemon=True),
                        threading.Thread(target=self._read_err, daemon=True)]
        for t in self.threads:
            t.start()

    def _read_out(self) -> None:
        """Queue each window at its mark; None once bpftrace has exited (or this reader failed)."""
        try:
            self._windows_of(iter(self.proc.stdout.readline, ""))
        except Exception as e:                          # a defect of ours: said by poll(), not a thread's trace
            self.failed = f"{type(e).__name__}: {e}"
        finally:
            self.windows.put(None)                      # bpftrace exited: every later poll says so

    def _windows_of(self, lines_in) -> None:
        lines: list[str] = []
        held, held_at = {}, None
        for line in lines_in:
            if WINDOW_MARK in line and '"printf"' in line:
                now, maps, lines = self.clock(), parse_output("\n".join(lines)), []
                try:
                    maps = merge_maps(held, maps)
                except TypeError:                       # one map of two shapes: the held window goes alone
                    held["_window_s"], self.last = held_at - self.last, held_at
                    self.windows.put(held)
                if now - self.last < self.shortest:
                    held, held_at = maps, now           # its span goes on from self.last
                    continue
                maps["_window_s"], self.last, held = now - self.last, now, {}
                self.windows.put(maps)
            elif line.startswith("{"):
                lines.append(line)

    def _read_err(self) -> None:
        for line in iter(self.proc.stderr.readline, ""):
            self.err = (self.err + line)[-self.STDERR_KEPT:]

    def poll(self, timeout: float) -> dict | None:
        """The next window's maps if bpftrace dumps them within `timeout`, else None; as parse_output gives
        them, with _window_s (its length) and _stderr. An error once bpftrace has exited."""
        try:
            maps = self.windows.get(timeout=timeout)
        except queue.Empty:
            return None
        if maps is None:
            self.windows.put(None)                      # every later poll says so too
            if self.failed:
                raise ProxytuneError(f"reading bpftrace's windows failed ({self.failed})")
            rc = self.proc.wait()
            raise ProxytuneError(f"bpftrace exited with {rc} ({_clean(self.err)[-200:] or 'no message'})")
        maps["_stderr"] = _clean(self.err)
        return maps

    def next_window(self, timeout: float) -> dict:
        """poll(), where no window by the deadline is an error: that window's counts are lost."""
        maps = self.poll(timeout)
        if maps is None:
            raise ProxytuneError(f"bpftrace printed no window in {timeout:g} s",
                                 "the host may be overloaded; the watcher restarts its probes")
        return maps

    def stop(self) -> None:
        """Detach: the window under way is dropped (no dump is waited for)."""
        procgroup.end(self.proc, grace=STOP_GRACE_S, nudge=(signal.SIGTERM, NUDGE_S))
        for t in self.threads:
            t.join(timeout=5)


def _where(pid: int, cpu_s: float, wall_s: float) -> str:
    """bpftrace's CPU in its wall time, its state and kernel wait channel: what a stuck attach was doing."""
    try:
        wchan = Path(f"/proc/{int(pid)}/wchan").read_text().strip() or "-"
    except OSError:
        wchan = "?"
    st = procfs.read_stat(pid)
    return f"{cpu_s:.1f} s of CPU in {wall_s:.0f} s, state {st.state if st else '?'}, waiting in {wchan}"


def _clean(err: str) -> str:
    """bpftrace's RLIMIT_MEMLOCK complaint is harmless here (it loads anyway); drop it."""
    return "\n".join(l for l in (err or "").splitlines() if "RLIMIT_MEMLOCK" not in l).strip()


def run_for(scripts: list[Script], pids: list[int], seconds: float, args: dict[str, dict] | None = None) -> dict:
    """Run scripts together for `seconds` and return the merged maps (`args`: compose()'s per script)."""
    with procgroup.Children() as kids:
        run = Run(kids, compose(scripts, pids, args))
        run.wait_attached()
        watch = target.Watch(pids)
        watch.wait(seconds)
        maps = run.stop()
    if watch.all_gone:
        raise watch.gone_error(seconds)
    return maps


def version() -> str | None:
    if not shutil.which("bpftrace"):
        return None
    p = subprocess.run(["bpftrace", "--version"], capture_output=True, text=True)
    return p.stdout.strip() or None

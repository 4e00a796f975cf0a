"""CPU evidence from perf: where the target's CPU goes, from system-wide
cpu-clock sampling filtered by pid (software event: works in VMs without
hardware counters), split into the proxy's own code, the kernel and shared
libraries (Maltzahn et al.'s Table 1); and cache misses from hardware
counters where they exist, else from cachegrind on a reproduction run."""

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

from proxytune.core.errors import ProxytuneError
from proxytune.core.invocation import needs_root
from proxytune.core import procfs, procgroup, rundir
from proxytune.core.numbers import DIGITS, is_uint, uint

from . import caps, target

SAMPLE_HZ = 199
STACK_BYTES = 8192      # user stack copied per sample for DWARF unwinding (Debian's squid/nginx have no frame pointers)
HEADER = re.compile(r"^\s*(\d+)/(\d+)\s*$")
ONE_LINE = re.compile(r"^\s*(\d+)/(\d+)\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$")
FRAME = re.compile(r"^\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$")


def describe(hz: int = SAMPLE_HZ, callgraph: bool = True) -> str:
    """How Record samples, in one line (for result files)."""
    return f"cpu-clock {hz} Hz, " + (f"dwarf call graphs ({STACK_BYTES} B of user stack)" if callgraph else "no call graphs")


class Record:
    """`perf record -e cpu-clock -a --call-graph dwarf` in the background; stop() summarises the target pids."""

    def __init__(self, kids: procgroup.Children, hz: int = SAMPLE_HZ, callgraph: bool = True, bpf: bool = True):
        """bpf=False: no side-band thread for BPF program events (samples in a BPF program lose its
        name); on a busy host that thread held perf's exit 0.7-1.1 s (a poll it waits out), against
        0.004 s without it. Build ids are never collected (-B): their pass over the file at exit costs
        time and perf script finds the objects by path."""
        if not shutil.which("perf"):
            raise ProxytuneError("perf is not installed", "Debian: apt-get install linux-perf")
        self.data = kids.dir / "perf.data"              # the run's private dir, never cwd: it holds user stacks
        self.hz = hz
        cg = ["--call-graph", f"dwarf,{STACK_BYTES}"] if callgraph else []
        self.proc = kids.start(["perf", "record", "-e", "cpu-clock", "-F", str(hz), "-a", "-q", "--no-buildid-cache",
                                "--no-buildid", *([] if bpf else ["--no-bpf-event"]), *cg, "-o", str(self.data)])

    def wait_started(self, timeout: float = 2.0) -> None:
        """Until perf has written its file's header, which it does once its events are open
        (tools/perf/builtin-record.c: record__open, then the header): 0.12-0.18 s on a busy 2-core
        host, where a fixed sleep took 0.3 s a window. At most `timeout`; perf exiting ends it too."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                if self.data.stat().st_size > 0:
                    return
            time.sleep(0.005)

    def stop(self, pids: list[int]) -> dict:
        _, err = procgroup.stop(self.proc, grace=60)
        try:
            if not self.data.exists():
                return {"available": False, "reason": f"perf record wrote nothing: {err.strip()[-200:]}"}
            p = subprocess.run(["perf", "script", "-i", str(self.data), "-F", "pid,tid,ip,sym,dso",
                                "--pid", ",".join(map(str, pids))], capture_output=True, text=True, timeout=300)
            return {**summarise(p.stdout, pids), "hz": self.hz}
        finally:
            self.data.unlink(missing_ok=True)


def classify(dso: str, exes: set[str]) -> str:
    if dso.startswith("bpf_prog_"):  # our own tracepoint programs: the probes' cost, visible
        return "bpf probes"
    if dso == "inlined":            # perf names the inlined function but not the object it sits in
        return "unknown"
    if dso == "[vdso]" or ".so" in dso:
        return "shared library"
    if dso.startswith("[kernel") or dso.endswith(".ko"):
        return "kernel"
    if dso in exes or any(Path(dso).name == Path(e).name for e in exes):
        return "proxy"
    return "unknown" if dso in ("[unknown]", "unknown") else "proxy"


def samples(script_out: str):
    """perf script output -> [(pid, [(sym, dso), ...leaf first])]; a sample without a call graph
    is one line, pid/tid then its frame."""
    out, cur = [], None
    for line in script_out.splitlines():
        one = ONE_LINE.match(line)
        if one:
            out.append((int(one.group(1)), [(one.group(4) or "[unknown]", one.group(5))]))
            cur = None
            continue
        m = HEADER.match(line)
        if m:
            cur = (int(m.group(1)), [])
            out.append(cur)
            continue
        f = FRAME.match(line)
        if f and cur is not None:
            cur[1].append((f.group(2) or "[unknown]", f.group(3)))
    return out


def summarise(script_out: str, pids: list[int]) -> dict:
    """Samples of the target pids: self time by function (the leaf), the proxy / kernel / library
    split, and per function of the proxy's own code the samples where it is the deepest own frame,
    which charges it with the kernel and library work it calls directly (poll() to comm_select)."""
    want = set(pids)
    exes = {e for e in (procfs.exe_of(p) for p in pids) if e}
    leaf, own, split = Counter(), Counter(), Counter()
    n = 0
    for pid, frames in samples(script_out):
        if pid not in want or not frames:
            continue
        n += 1
        sym, dso = frames[0]
        where = classify(dso, exes)
        leaf[(sym, _short(dso), where)] += 1
        split[where] += 1
        mine = next(((s, d) for s, d in frames if classify(d, exes) == "proxy" and s != "[unknown]"), None)
        if mine:
            own[(mine[0], _short(mine[1]))] += 1
    top = [{"function": f, "dso": d, "where": w, "samples": c, "share": c / n}
           for (f, d, w), c in leaf.most_common(15)] if n else []
    own_top = [{"function": f, "dso": d, "samples": c, "share": c / n} for (f, d), c in own.most_common(10)] if n else []
    return {"available": True, "samples": n, "split": {k: v / n for k, v in split.items()} if n else {},
            "top": top, "own_top": own_top,
            "own_attributed": sum(own.values()) / n if n else 0.0}


def _short(dso: str) -> str:
    return Path(dso).name if dso.startswith("/") else dso


def sample_cpu(pids: list[int], duration: float) -> dict:
    """`probe hotspots`: perf cpu-clock samples of the whole machine for the window, kept for pids.
    Refused where this user may not sample (else perf records nothing, which reads as idle); an
    error when every target exits during the window."""
    if os.geteuid() != 0 and not (sampling := caps.perf_sampling()).ok:
        raise needs_root(sampling.why) if shutil.which("perf") else ProxytuneError(sampling.why)
    with procgroup.Children() as kids:
        rec = Record(kids)
        watch = target.Watch(pids)
        watch.wait(duration)
        r = rec.stop(pids)
    if watch.all_gone:
        raise watch.gone_error(duration)
    return r


# ------------------------------------------------------------------ cache misses

def cache_misses(argv: list[str]) -> dict:
    """D1 misses of a command: the hardware counters' totals where the machine has them, else
    cachegrind's simulated D1, per function."""
    hw = hw_cache_misses(argv) if caps.hardware_counters().ok else None
    return hw or cachegrind(argv)


def hw_cache_misses(argv: list[str]) -> dict | None:
    """perf stat's L1-dcache-load-misses for a command, or None where the counters are missing."""
    p = subprocess.run(["perf", "stat", "-x,", "-e", "instructions,L1-dcache-load-misses", "--"] + argv,
                       capture_output=True, text=True)
    vals = {}
    for line in p.stderr.splitlines():
        f = line.split(",")
        if len(f) > 2 and is_uint(f[0].strip()):
            vals[f[2]] = uint(f[0].strip())
    if "L1-dcache-load-misses" not in vals:
        return None
    return {"source": "hardware counters (perf stat)", "instructions": vals.get("instructions"),
            "d1_misses": vals["L1-dcache-load-misses"], "functions": []}




def cachegrind(argv: list[str], d1: str = "32768,8,64") -> dict:
    """Run CMD under cachegrind (simulated D1), and rank functions by D1 read+write misses."""
    if not shutil.which("valgrind"):
        raise ProxytuneError("valgrind is not installed", "Debian: apt-get install valgrind")
    with rundir.RunDir("cachegrind") as d:
        out = d.path / "cg.out"
        p = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--D1={d1}",
                            "--LL=8388608,16,64", f"--cachegrind-out-file={out}"] + argv,
                           capture_output=True, text=True)
        if not out.exists():
            raise ProxytuneError(f"cachegrind did not run the command: {p.stderr.strip()[-200:]}")
        funcs, totals = parse_cachegrind_out(out.read_text())
    d1_misses = totals.get("D1mr", 0) + totals.get("D1mw", 0)
    ranked = sorted(funcs.items(), key=lambda kv: -(kv[1].get("D1mr", 0) + kv[1].get("D1mw", 0)))
    return {"source": f"cachegrind (simulated D1 {d1})", "instructions": totals.get("Ir"),
            "d1_misses": d1_misses, "exit_code": p.returncode,
            "functions": [{"function": f, "d1_misses": v.get("D1mr", 0) + v.get("D1mw", 0),
                           "share": (v.get("D1mr", 0) + v.get("D1mw", 0)) / d1_misses if d1_misses else 0.0,
                           "instructions": v.get("Ir", 0)} for f, v in ranked[:15]]}


def parse_cachegrind_out(text: str) -> tuple[dict, dict]:
    """cachegrind.out format: 'events:' names the columns; 'fn=' starts a function; number lines add up."""
    events, funcs, fn = [], {}, None
    totals = {}
    for line in text.splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("fn="):
            fn = line[3:]
            funcs.setdefault(fn, {})
        elif DIGITS.match(line) and fn is not None:
            nums = [int(x) for x in line.split()[1:]]
            acc = funcs[fn]
            for e, v in zip(events, nums):
                acc[e] = acc.get(e, 0) + v
                totals[e] = totals.get(e, 0) + v
    return funcs, totals

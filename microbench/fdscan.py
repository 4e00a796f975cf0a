"""`bench fdscan`: Mogul's five comm_select variants, cost per call against N
and D1 misses per call.

D1 misses come from hardware counters when the machine has them (perf
stat), otherwise from valgrind's cachegrind with an explicit geometry: left
on auto it models the host's own, and a huge L3 hides nothing we care
about, but the point is to fix D1 so results compare across hosts. Misses
per call = (misses at 2C calls - misses at C calls) / C, so set-up is
subtracted.
"""

import concurrent.futures
import json
import os
import re
import shutil
import subprocess

from proxytune.core.capability import perf_counts

from proxytune.core import stats
from .build import Harness, build
from .runner import HarnessError, failed_point, progress, run_json, unavailable

HARNESS = Harness("fdscan", "fdscan")
VARIANTS = {1: "array of structs, fields on 3 cache lines", 2: "array of structs, fields adjacent",
            3: "separate compact array of the 3 fields", 4: "long-lived bitmaps, copied per call",
            5: "bitmaps + word-at-a-time result scan"}
FULL = {"ns": [100, 300, 1000, 3000, 10000, 30000], "reps": 7, "miss_n": 10000}
QUICK = {"ns": [100, 1000, 10000], "reps": 5, "miss_n": 10000}
D1 = "32768,8,64"            # 32 KiB, 8-way, 64-byte lines: today's common L1D
LL = "8388608,16,64"


def calls_for(variant: int, n: int) -> int:
    per_fd_ns = {1: 4.0, 2: 2.5, 3: 2.5, 4: 0.7, 5: 0.02}[variant]
    return max(20, min(200000, int(2e7 / (per_fd_ns * n + 50))))


def _cachegrind_misses(exe, variant, n, calls) -> int:
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--D1={D1}", f"--LL={LL}",
           "--cachegrind-out-file=/dev/null", str(exe), "--variant", str(variant), "--n", str(n),
           "--calls", str(calls), "--reps", "1"]
    m = re.search(r"D1\s+misses:\s+([\d,]+)", _counter_run(cmd).stderr)
    if not m:
        raise HarnessError(f"cachegrind printed no D1 misses for {exe.name}", " ".join(cmd))
    return int(m.group(1).replace(",", ""))


def _counter_run(cmd: list[str]) -> subprocess.CompletedProcess:
    """valgrind or perf stat over the harness. Both still print counts when the harness fails (its
    exit status is theirs): a failed run is an error, never a measurement (it gave 0.0 misses/call)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"{cmd[0]} over the fdscan harness did not finish in 600 s", " ".join(cmd)) from None
    if p.returncode != 0 or not _printed_result(p.stdout):
        said = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("==")]
        raise HarnessError(f"the fdscan harness failed under {cmd[0]} (exit {p.returncode}"
                           + (")" if p.returncode else ", but the harness printed no result)")
                           + (f": {said[0].strip()}" if said else ""), " ".join(cmd))
    return p


def _printed_result(stdout: str) -> bool:
    """The harness prints its JSON result only when it ran to the end. That, not the counter's exit
    status, says it ran: a perf stat that exits 0 over a failed harness must not yield a count."""
    try:
        return isinstance(json.loads(stdout), dict)
    except ValueError:
        return False


def _perf_misses(exe, variant, n, calls) -> int:
    cmd = ["perf", "stat", "-x,", "-e", "L1-dcache-load-misses", str(exe), "--variant", str(variant),
           "--n", str(n), "--calls", str(calls), "--reps", "1"]
    p = _counter_run(cmd)
    try:
        return int(p.stderr.strip().splitlines()[-1].split(",")[0])
    except (IndexError, ValueError):
        raise HarnessError(f"perf stat printed no L1-dcache-load-misses count for {exe.name} "
                           f"(exit {p.returncode})", " ".join(cmd)) from None


def misses_per_call(exe, variant, n, source) -> float:
    calls = 20
    count = _perf_misses if source == "perf" else _cachegrind_misses
    return (count(exe, variant, n, 2 * calls) - count(exe, variant, n, calls)) / calls


def _measure(result: dict, exe, kind: str, v: int, n: int, plan: dict, source: str | None) -> None:
    if kind == "time":
        doc = run_json([exe, "--variant", v, "--n", n, "--calls", calls_for(v, n), "--reps", plan["reps"]])
        result["points"].append({"variant": v, "n": n,
                                 "ns_per_call": stats.summary([r["ns_per_call"] for r in doc["reps"]]),
                                 "handlers_per_call": doc["reps"][0]["handlers_per_call"],
                                 "command": doc["command"]})
    elif source:
        result["misses"].append({"variant": v, "n": n, "d1_misses_per_call": misses_per_call(exe, v, n, source)})


def _counted(exe, kind: str, v: int, n: int, plan: dict, source: str) -> list[dict]:
    """_measure() of a miss count on its own, for a pool: the misses it adds."""
    box: dict = {"misses": []}
    _measure(box, exe, kind, v, n, plan, source)
    return box["misses"]


def run(quick: bool = False, quiet: bool = False) -> dict:
    plan = QUICK if quick else FULL
    try:
        exe = build(HARNESS)
    except HarnessError as e:
        return unavailable({"bench": "fdscan", "quick": quick, "points": [], "misses": [],
                            "miss_source": "unavailable"}, e)
    hw = perf_counts("L1-dcache-load-misses")
    source = "perf" if hw.ok else ("cachegrind" if shutil.which("valgrind") else None)
    jobs = [("time", v, n) for v in VARIANTS for n in plan["ns"]] + [("misses", v, plan["miss_n"]) for v in VARIANTS]
    result = {"bench": "fdscan", "quick": quick, "variants": {str(k): v for k, v in VARIANTS.items()},
              "points": [], "misses": [],
              "miss_source": source or "unavailable",
              "miss_source_note": "hardware counters (perf stat)" if hw.ok else hw.why,
              "cachegrind_geometry": {"D1": D1, "LL": LL} if source == "cachegrind" else None}
    if source is None:
        result["miss_source_note"] = f"{hw.why}; valgrind is not installed either (Debian: valgrind)"
    # cachegrind's counts are simulated, not timed: its runs share the CPUs (they were ~5 s of the quick
    # report one after the other); timed points and hardware counters run alone
    together = [j for j in jobs if j[0] == "misses"] if source == "cachegrind" else []
    with progress(quiet) as bar, concurrent.futures.ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        task = bar.add_task("bench fdscan", total=len(jobs))
        counted: dict = {}
        for job in jobs:
            kind, v, n = job
            bar.update(task, description=f"fdscan {kind} variant {v} N={n}")
            if job in together and not counted:          # the timed points are done (jobs: times first)
                counted = {j: pool.submit(_counted, exe, *j, plan, source) for j in together}
            try:
                if job in counted:
                    result["misses"] += counted[job].result()
                else:
                    _measure(result, exe, kind, v, n, plan, source)
            except HarnessError as e:
                failed_point(result, {"mode": kind, "variant": v, "n": n}, e)
            bar.advance(task)
    m = {x["variant"]: x["d1_misses_per_call"] for x in result["misses"]}
    if 1 in m and 3 in m and m[3] > 0:
        result["miss_ratio_1_over_3"] = m[1] / m[3]
    largest = max(plan["ns"])
    at = {p["variant"]: p["ns_per_call"]["median"] for p in result["points"] if p["n"] == largest}
    result["fastest_at_largest_n"] = min(at, key=at.get) if at else None
    return result

"""`bench events`: select / poll / epoll / io_uring / kqueue swept over the
number of idle descriptors, plus churn, load batching, the libevent-bench
workload and perf's epoll benchmark as an outside reference.

Each point is one evbench process with a warm-up and >= 5 repetitions;
we keep the median, the spread and a bootstrap CI, flag points whose
process did not get its CPU (cpu_share < 0.9: the machine was busy), and
fit t = a + b*N + c*K per mechanism.
"""

import re
import shutil
import subprocess

from proxytune.core import stats
from .build import Harness, build
from .runner import HarnessError, failed_point, progress, run_json, unavailable

HARNESS = Harness("evbench", "evbench", flags=("-pthread",), uring=True)
FULL = {"ns": [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000], "ks": [1, 10, 100, 1000],
        "ready": ["hot", "cold"], "reps": 7, "rates": [2000, 5000, 10000, 20000, 30000, 40000, 60000], "perf_bench": True,
        "churn": True}
# quick: the O(N) headline in about 10 s here; churn and perf's own epoll benchmark (an outside
# reference), which feed no conclusion of the report, only in full
QUICK = {"ns": [10, 100, 1000, 10000], "ks": [1], "ready": ["hot"], "reps": 5, "rates": [5000, 60000], "perf_bench": False,
         "churn": False}
NOISY_CPU_SHARE = 0.9
LOAD_BACKENDS = ("poll", "epoll")


def calls_for(backend: str, n: int, k: int = 1, ready: str = "hot") -> int:
    """Enough calls for ~50 ms per repetition without a calibration run: a select or poll call
    costs ~100 ns per idle socketpair at N=1,000 here and ~570 ns at N=10,000 (cache misses), so
    at most 50 calls there (4,000,000 // N gave 400: 5.7 ms each, 12 s of the quick report).
    Cold calls also drain and refill K descriptors untimed: fewer when K is large."""
    calls = max(20, min(5000, 50_000_000 // (100 * n + 1000))) if backend in ("select", "poll") else 5000
    if ready == "cold":
        calls = max(20, min(calls, 100_000 // k))
    return calls


def available(exe) -> list[dict]:
    return run_json([exe, "--mode", "list"])["backends"]


def point(exe, backend, n, k, ready, reps, pin, tcp) -> dict:
    calls = calls_for(backend, n, k, ready)
    argv = [exe, "--mode", "idle", "--backend", backend, "--n", n, "--k", k, "--ready", ready,
            "--calls", calls, "--reps", reps, "--warmup", max(5, calls // 10)]
    argv += ["--pin", pin] if pin is not None else []
    argv += ["--tcp"] if tcp else []
    doc = run_json(argv)
    if not doc.get("available", True):
        return {"backend": backend, "n": n, "k": k, "ready": ready, "available": False, "reason": doc["reason"]}
    reps_ = doc["reps"]
    share = stats.summary([r["cpu_share"] for r in reps_])["median"]
    return {"backend": backend, "n": doc["params"]["n"], "n_requested": n, "k": doc["params"]["k"], "ready": ready,
            "available": True, "capped": doc["nofile"]["capped"],
            "ns_per_call": stats.summary([r["ns_per_call"] for r in reps_]),
            "ns_per_event": stats.summary([r["ns_per_event"] for r in reps_])["median"],
            "events_per_call": stats.summary([r["events_per_call"] for r in reps_])["median"],
            "wrong_counts": doc["wrong_counts"], "cpu_share": share, "noisy": share < NOISY_CPU_SHARE,
            "floor": doc["floor"], "command": doc["command"]}


def churn(exe, backend, n, reps) -> dict:
    doc = run_json([exe, "--mode", "churn", "--backend", backend, "--n", n, "--calls", 2000, "--reps", reps,
                    "--warmup", 200])
    return {"backend": backend, "n": doc["params"]["n"],
            "ns_per_request": stats.summary([r["ns_per_request"] for r in doc["reps"]]),
            "ns_per_request_with_wait": stats.summary([r["ns_per_request_with_wait"] for r in doc["reps"]]),
            "command": doc["command"]}


def load(exe, backend, n, rate, ms) -> dict:
    doc = run_json([exe, "--mode", "load", "--backend", backend, "--n", n, "--rate", rate, "--duration-ms", ms,
                    "--work-us", 20, "--reps", 1])
    r = doc["reps"][0]
    return {"backend": backend, "n": n, "offered_per_s": rate, "events_per_call": r["events_per_call"],
            "handled_per_s": r["handled_per_s"], "wait_ns_per_event": r["wait_ns_per_event"],
            "command": doc["command"]}


def libevent(exe, backend, reps) -> dict:
    doc = run_json([exe, "--mode", "libevent", "--backend", backend, "-n", 100, "-a", 1, "-w", 100, "--reps", reps])
    return {"backend": backend, "us_per_run": stats.summary([r["us_per_run"] for r in doc["reps"]]),
            "command": doc["command"]}


def perf_bench_epoll(seconds: int) -> dict:
    """perf's own epoll_wait benchmark, when perf is installed: an outside reference."""
    if not shutil.which("perf"):
        return {"available": False, "reason": "perf is not installed (Debian: linux-perf)"}
    cmd = ["perf", "bench", "epoll", "wait", "-t", "1", "-f", "100", "-r", str(seconds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    m = re.search(r"Averaged (\d+) operations/sec \(\+- ([\d.]+)%\)", proc.stdout + proc.stderr)
    if not m:
        return {"available": False, "reason": (proc.stderr or proc.stdout).strip()[-200:], "command": " ".join(cmd)}
    ops = int(m.group(1))
    return {"available": True, "ops_per_s": ops, "spread_pct": float(m.group(2)), "ns_per_op": 1e9 / ops,
            "command": " ".join(cmd)}


def derive(points: list[dict]) -> dict:
    """Per mechanism: the fitted model, the knee, the N=10k/N=100 ratio; poll/epoll crossover."""
    out: dict = {"fits": {}, "knees": {}, "scaling": {}}
    hot = [p for p in points if p["available"] and p["ready"] == "hot"]
    for be in sorted({p["backend"] for p in hot}):
        mine = [p for p in hot if p["backend"] == be]
        out["fits"][be] = stats.fit_model([(p["n"], p["k"], p["ns_per_call"]["median"]) for p in mine])
        k1 = sorted((p for p in mine if p["k"] == 1), key=lambda p: p["n"])
        if k1:
            ns, ts = [p["n"] for p in k1], [p["ns_per_call"]["median"] for p in k1]
            out["knees"][be] = stats.knee(ns, ts)
            small = next((p for p in k1 if p["n"] == 100), None)
            large = k1[-1]
            if small and large["n"] >= 5000:
                out["scaling"][be] = {"n_small": 100, "n_large": large["n"],
                                      "ratio": large["ns_per_call"]["median"] / small["ns_per_call"]["median"]}
    by = {(p["backend"], p["n"]): p["ns_per_call"]["median"] for p in hot if p["k"] == 1}
    ns = sorted({n for b, n in by if b == "poll"} & {n for b, n in by if b == "epoll"})
    if ns:
        out["crossover_poll_epoll"] = stats.crossover(ns, [by[("poll", n)] for n in ns], [by[("epoll", n)] for n in ns])
    return out


def run(quick: bool = False, backends: list[str] | None = None, pin: int | None = None, tcp: bool = False,
        quiet: bool = False) -> dict:
    plan = QUICK if quick else FULL
    result = {"bench": "events", "quick": quick, "backends": [], "idle": [], "churn": [], "load": [], "libevent": [],
              "scaling": {}}
    try:
        exe = build(HARNESS)
        listing = available(exe)
    except HarnessError as e:
        return unavailable(result, e)
    names = [b["name"] for b in listing if b["available"] and (not backends or b["name"] in backends)]
    idle_names = [b for b in names if b != "io_uring-multishot"] + (["io_uring-multishot"] if "io_uring-multishot" in names and "cold" in plan["ready"] else [])
    jobs = [("idle", be, n, k, ready) for ready in plan["ready"] for be in idle_names for n in plan["ns"]
            for k in plan["ks"] if k <= n and not (be == "io_uring-multishot" and ready == "hot")]
    jobs += [("churn", be, 1000) for be in names if plan["churn"]]
    jobs += [("load", be, r) for be in LOAD_BACKENDS if be in names for r in plan["rates"]]
    jobs += [("libevent", be) for be in names]
    result.update(harness=str(exe.name), backends=listing)
    with progress(quiet) as bar:
        task = bar.add_task("bench events", total=len(jobs) + 1)
        for job in jobs:
            bar.update(task, description=f"{job[0]} {job[1]} {' '.join(map(str, job[2:]))}")
            try:
                if job[0] == "idle":
                    result["idle"].append(point(exe, *job[1:], plan["reps"], pin, tcp))
                elif job[0] == "churn":
                    result["churn"].append(churn(exe, job[1], job[2], plan["reps"]))
                elif job[0] == "load":
                    result["load"].append(load(exe, job[1], 1000, job[2], 300 if quick else 1000))
                else:
                    result["libevent"].append(libevent(exe, job[1], 5 if quick else 25))
            except HarnessError as e:
                failed_point(result, {"mode": job[0], "backend": job[1], "args": list(job[2:])}, e)
                if job[0] == "idle":
                    n, k, ready = job[2:]
                    result["idle"].append({"backend": job[1], "n": n, "k": k, "ready": ready, "available": False,
                                           "reason": e.message})
            bar.advance(task)
        bar.update(task, description="perf bench epoll wait")
        result["perf_bench_epoll"] = (perf_bench_epoll(5) if plan["perf_bench"] else
                                      {"available": False, "reason": "run in bench events (not --quick) only"})
        bar.advance(task)
    result.update(derive(result["idle"]))
    result["noisy_points"] = sum(1 for p in result["idle"] if p.get("noisy"))
    return result

"""The doctor on a proxy the report starts itself: Debian's nginx (one worker, in-memory
answers) under wrk. The report's seeds need a proxy's CPU per request split into proxy,
kernel and libraries; watching a proxy the host runs would be intrusive, and its findings
belong to `doctor`, not to a load we made. So only the loop's costs are kept."""

import contextlib
import functools
import time

from proxytune.core import procgroup
from proxytune.core.errors import ProxytuneError
from proxytune.proxies.launch import wrk
from proxytune.proxies.nginx import NginxServer

from . import budget, caps, overhead, perf, proc


def cpu_split_on_nginx(seconds: float = 5.0, connections: int = 50) -> dict:
    """{"proxy", "window_s", "evidence": {"loop", "perf"}} from one doctor window under load
    (the window opens first, as `probe overhead` attaches it, then wrk runs through it)."""
    with NginxServer(workers=1) as ng:
        with overhead.attached("doctor", proc.resolve(ng.pid, None), seconds) as box:
            wrk(f"http://127.0.0.1:{ng.port}/", seconds + 1, connections)   # outlasts the window
    return watched(box, "nginx (1 worker, started by the report, under wrk)")


def cpu_view(label: str, window_s: float, loop: dict, perf: dict) -> dict:
    """A proxy's CPU in a window, in the shape the doctor's evidence has (seeds.cpu_split reads it)."""
    return {"proxy": label, "window_s": round(window_s, 2),
            "evidence": {"loop": loop, "perf": {k: v for k, v in perf.items()
                                                if k in ("available", "reason", "split", "samples", "hz")}}}


def watched(box: dict, label: str) -> dict:
    """What a doctor window on a proxy we loaded says about its CPU: the loop's split and perf's."""
    ev = box["evidence"]
    return cpu_view(label, ev["window_s"], ev["loop"], ev["perf"])


@functools.lru_cache(maxsize=1)
def _sampling() -> caps.Capability:
    """Whether perf can sample, found once a process (`perf record -a -- true`: ~1 s each time here,
    once per watched run of a report's series)."""
    return caps.perf_sampling()


class PerfWatch:
    """perf on a proxy a benchmark loads (microbench.proxybench run_store's `watch`, given by the report:
    the benchmarks do not import the doctor): the CPU split of its samples, in the doctor's shape."""

    @staticmethod
    @contextlib.contextmanager
    def around(pid: int, out: dict):
        """perf samples the whole host while the proxy's load runs (cpu-clock: no hardware counters
        needed); its split of the proxy's samples (kernel, its own code, libraries) lands in out.
        No call graphs: the split needs the sampled frame only, and unwinding costs seconds."""
        sampling = _sampling()
        if not sampling.ok:
            out["perf"] = sampling.to_result()
            yield
            return
        pids = proc.resolve(pid, None)
        with procgroup.Children() as kids:
            rec = perf.Record(kids, callgraph=False, bpf=False)     # no probes of ours run beside it
            rec.wait_started()                           # perf has opened its events
            t0 = time.monotonic()
            yield
            out["window_s"] = time.monotonic() - t0
            out["perf"] = rec.stop(pids)

    @staticmethod
    def view(box: dict, label: str) -> dict:
        """The CPU split of a proxy we loaded, in the shape the doctor's evidence has (seeds.cpu_split)."""
        prof = box.get("perf") or {"available": False, "reason": "not watched"}
        loop = {"cpu_split": {k: round(v, 3) for k, v in prof["split"].items()}} if prof.get("split") else {}
        return cpu_view(label, box.get("window_s", 0.0), loop, prof)


class BudgetWatch:
    """The doctor's probes (bpftrace, not perf) on a proxy a benchmark loads, for one steady phase of
    `seconds`: its time budget (where the load's latency went: reports/latency.py). No perf: the
    budget is made of the probes' clocks alone (probes/budget.py), and the window's CPU split is not
    used (a doctor-watched window gives none: microbench.proxysides); perf's exit and script cost
    1-2 s. The compile and attach cost a few seconds before the load starts, so a report takes it on
    one window only (microbench.hostsettings: the warm-up window, a before side's and no pair's)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    @contextlib.contextmanager
    def around(self, pid: int, out: dict):
        """The doctor attached for the window; where it cannot attach (no bpftrace, no tracefs), perf
        alone watches, as PerfWatch does, and why the budget is missing is kept."""
        with contextlib.ExitStack() as stack:
            try:
                box = stack.enter_context(overhead.attached("bpftrace", proc.resolve(pid, None), self.seconds,
                                                            stacks=False))
            except ProxytuneError as e:
                out["budget_unavailable"] = e.message
                with PerfWatch.around(pid, out):
                    yield
                return
            yield
        out["evidence"] = box.get("evidence")

    @staticmethod
    def view(box: dict, label: str) -> dict:
        """The doctor's CPU split and time budget of the window, in the doctor's shape (perf's split
        and no budget when the doctor could not attach)."""
        ev = box.get("evidence")
        if not ev:
            return {**PerfWatch.view(box, label), "budget": None,
                    "budget_unavailable": box.get("budget_unavailable", "the doctor did not watch")}
        try:
            b = budget.compute(ev)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:      # evidence short of a part
            b = {"parts": {}, "error": f"{type(e).__name__}: {e}"}
        return {**watched(box, label), "budget": b}

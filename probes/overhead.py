"""What the doctor costs the proxy it watches: nginx's CPU time per request
under wrk, with and without `doctor` attached (bpftrace's default scripts
plus perf sampling), in alternating runs so that drift cancels. The BPF
programs run in nginx's own context, so their cost lands in nginx's
system time, which is what this counts."""

import statistics
import threading
import time

from proxytune.microbench import servers, stats

from proxytune.core import procfs

from . import doctor, proc


def _cpu(pids: list[int]) -> float:
    return sum(procfs.cpu_seconds(p) or 0.0 for p in pids)


def _attached_run(pids: list[int], seconds: float):
    """Start the doctor in a thread; return (thread, started-event, result box)."""
    started, box = threading.Event(), {}

    def go():
        try:
            box["evidence"] = doctor.gather(pids, seconds, tick=lambda t: started.set())
        except BaseException as e:        # surfaced by the caller
            box["error"] = e
            started.set()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, started, box


def measure(seconds: float = 8, reps: int = 3, connections: int = 50, progress=None) -> dict:
    rows = []
    with servers.Nginx(workers=1) as ng:
        pids = proc.resolve(ng.pid, None)
        url = f"http://127.0.0.1:{ng.port}/"
        servers.wrk(url, 2, connections)                      # warm-up
        for rep in range(reps):
            for mode in (("off", "on") if rep % 2 == 0 else ("on", "off")):
                t = box = None
                if mode == "on":
                    t, started, box = _attached_run(pids, seconds + 3)
                    started.wait(60)
                    if "error" in box:
                        raise box["error"]
                    time.sleep(0.5)                           # the window is open; perf has started
                c0 = _cpu(pids)
                w = servers.wrk(url, seconds, connections)
                c1 = _cpu(pids)
                if t:
                    t.join()
                rows.append({"rep": rep, "doctor": mode, "requests": w["requests"], "rps": w["rps"],
                             "nginx_cpu_s": c1 - c0,
                             "cpu_us_per_request": (c1 - c0) * 1e6 / w["requests"] if w["requests"] else None})
                if progress:
                    progress()
    off = [r["cpu_us_per_request"] for r in rows if r["doctor"] == "off"]
    on = [r["cpu_us_per_request"] for r in rows if r["doctor"] == "on"]
    pairs = [b / a - 1 for a, b in zip(off, on)]
    return {"bench": "doctor-overhead", "seconds": seconds, "reps": reps, "connections": connections,
            "scripts": doctor.DEFAULT_SCRIPTS, "perf": f"cpu-clock {doctor.perf.SAMPLE_HZ} Hz, dwarf call graphs",
            "runs": rows,
            "off_us_per_request": stats.summary(off), "on_us_per_request": stats.summary(on),
            "overhead": statistics.median(on) / statistics.median(off) - 1,
            "overhead_per_pair": pairs,
            "rps_off": statistics.median(r["rps"] for r in rows if r["doctor"] == "off"),
            "rps_on": statistics.median(r["rps"] for r in rows if r["doctor"] == "on")}

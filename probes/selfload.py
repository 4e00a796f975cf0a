"""The doctor on a proxy the report starts itself: Debian's nginx (one worker, in-memory
answers) under wrk. The report's seeds need a proxy's CPU per request split into proxy,
kernel and libraries; watching a proxy the host runs would be intrusive, and its findings
belong to `doctor`, not to a load we made. So only the loop's costs are kept."""

from proxytune.microbench import servers

from . import overhead, proc


def cpu_split_on_nginx(seconds: float = 5.0, connections: int = 50) -> dict:
    """{"proxy", "window_s", "evidence": {"loop", "perf"}} from one doctor window under load
    (the window opens first, as `probe overhead` attaches it, then wrk runs through it)."""
    with servers.Nginx(workers=1) as ng:
        with overhead.attached("doctor", proc.resolve(ng.pid, None), seconds) as box:
            servers.wrk(f"http://127.0.0.1:{ng.port}/", seconds + 1, connections)   # outlasts the window
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

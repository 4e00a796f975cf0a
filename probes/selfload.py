"""The doctor on a proxy the report starts itself: Debian's nginx (one worker, in-memory
answers) under wrk. The report's seeds need a proxy's CPU per request split into proxy,
kernel and libraries; watching a proxy the host runs would be intrusive, and its findings
belong to `doctor`, not to a load we made. So only the loop's costs are kept."""

import threading

from proxytune.core.errors import ProxytuneError
from proxytune.microbench import servers

from . import doctor, proc


def cpu_split_on_nginx(seconds: float = 5.0, connections: int = 50) -> dict:
    """{"proxy", "window_s", "evidence": {"loop": ...}} from one doctor window under load."""
    with servers.Nginx(workers=1) as ng:
        pids = proc.resolve(ng.pid, None)
        opened, box = threading.Event(), {}

        def watch():
            try:
                box["doc"] = doctor.diagnose(pids, seconds, tick=lambda t: opened.set())
            except BaseException as e:        # raised again in the caller's thread
                box["error"] = e
            opened.set()

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        opened.wait(120)
        if "error" not in box:
            servers.wrk(f"http://127.0.0.1:{ng.port}/", seconds + 1, connections)
        t.join(seconds + 120)
    if "error" in box:
        raise box["error"]
    if "doc" not in box:
        raise ProxytuneError("the doctor did not finish its window on the report's nginx")
    loop = box["doc"]["evidence"]["loop"]
    return {"proxy": "nginx (1 worker, started by the report, under wrk)", "window_s": box["doc"]["window_s"],
            "evidence": {"loop": loop, "perf": {k: v for k, v in box["doc"]["evidence"]["perf"].items()
                                                 if k in ("available", "reason", "split")}}}

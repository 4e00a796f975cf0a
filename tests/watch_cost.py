"""What `proxytune watch` costs (issue 30 item 5): its CPU (its own process and its tracers,
bpftrace and perf, which are its children), its peak RSS and its recorder's disk, over a span
of a busy proxy: Debian's HAProxy in a loopback-only network namespace, paced by wrk inside it.

    flock /work/heavy.lock .venv/bin/python tests/watch_cost.py --minutes 60 --rate 2000 [--out cost.json]

The CLI is the one tests run (tests/faulty_cli.py: the checkout as the proxytune package, no fault set).
CPU is read from /proc every second: the watcher's utime + stime and those of every live
descendant, plus what its reaped children used (cutime + cstime): the sum only grows, so the
span's share of one core is (last - first) / wall. The proxy's own CPU is reported beside it
(the BPF programs run in the proxy's context, so their cost lands there, not in the watcher's).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

CONFIG = """global
    maxconn 2000
defaults
    mode http
    timeout connect 1s
    timeout client 5s
    timeout server 5s
frontend fe
    bind 127.0.0.1:18081
    http-request return status 200 content-type text/plain string ok
"""
PACED = 'request = function() return wrk.format("GET", "/") end\ndelay = function() return {ms} end\n'


def stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def cpu_s(pid: int, reaped: bool = False) -> float:
    """utime + stime of pid (fields 14, 15), with cutime + cstime (16, 17) when asked."""
    f = stat(pid)
    if f is None:
        return 0.0
    ticks = int(f[11]) + int(f[12]) + ((int(f[13]) + int(f[14])) if reaped else 0)
    return ticks / CLK


def descendants(pid: int) -> list[int]:
    kids, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        kids += map(int, children)
        todo += map(int, children)
    return kids


def rss_mib(pid: int) -> float:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20
    except OSError:
        return 0.0


def watcher_cpu(pid: int) -> float:
    return cpu_s(pid, reaped=True) + sum(cpu_s(k) for k in descendants(pid))


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def run(minutes: float, rate: int, window: float, conns: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="watch-cost-"))
    (tmp / "haproxy.cfg").write_text(CONFIG)
    (tmp / "paced.lua").write_text(PACED.format(ms=max(1, int(1000 * conns / rate))))
    hp = subprocess.Popen(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec haproxy -db -f "$1"', "sh",
                           str(tmp / "haproxy.cfg")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = [hp]
    try:
        time.sleep(1.0)
        load = subprocess.Popen(["nsenter", "-t", str(hp.pid), "-n", "wrk", "-t1", f"-c{conns}",
                                 f"-d{int(minutes * 60 + 120)}s", "-s", str(tmp / "paced.lua"),
                                 "http://127.0.0.1:18081/"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
        procs.append(load)
        w = subprocess.Popen([str(REPO / ".venv/bin/python"), str(HERE / "faulty_cli.py"), "--state-dir", str(tmp / "state"),
                              "watch", "--pid", str(hp.pid), "--window", str(window), "--max-size", "64M"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(w)
        time.sleep(max(30.0, 3 * window))           # past the first session's compile and attach
        t0, c0, p0 = time.monotonic(), watcher_cpu(w.pid), cpu_s(hp.pid)
        peak_self = peak_all = 0.0
        while time.monotonic() - t0 < minutes * 60:
            time.sleep(1.0)
            if w.poll() is not None:
                raise RuntimeError(f"the watcher exited: {w.stderr.read()[-500:]}")
            peak_self = max(peak_self, rss_mib(w.pid))
            peak_all = max(peak_all, rss_mib(w.pid) + sum(rss_mib(k) for k in descendants(w.pid)))
        wall, c1, p1 = time.monotonic() - t0, watcher_cpu(w.pid), cpu_s(hp.pid)
        w.send_signal(signal.SIGINT)
        _, err = w.communicate(timeout=120)
        records = len(list((tmp / "state" / "watch").glob("*")))
        return {"minutes": round(wall / 60, 2), "window_s": window, "rate_per_s": rate, "connections": conns,
                "watcher_cpu_s": round(c1 - c0, 2), "watcher_core_share": round((c1 - c0) / wall, 5),
                "proxy_core_share": round((p1 - p0) / wall, 4),
                "watcher_rss_peak_mib": round(peak_self, 1), "with_tracers_rss_peak_mib": round(peak_all, 1),
                "recorder_bytes": du(tmp / "state" / "watch"), "recorder_files": records,
                "watcher_said": err.strip().splitlines()[-5:]}
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--rate", type=int, default=2000, help="requests per second wrk paces to")
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if os.geteuid() != 0 or not all(map(shutil.which, ("haproxy", "wrk", "bpftrace"))):
        print("needs root, haproxy, wrk and bpftrace", file=sys.stderr)
        return 2
    result = run(a.minutes, a.rate, a.window, a.connections)
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

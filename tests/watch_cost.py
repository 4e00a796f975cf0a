"""What `proxytune watch` costs (issue 30 item 5): its CPU (its own process and its tracers,
bpftrace and perf, which are its children), its peak RSS and its recorder's disk, over a span
of a busy proxy: Debian's HAProxy in a loopback-only network namespace, paced by wrk inside it.

    flock /work/heavy.lock .venv/bin/python tests/watch_cost.py --minutes 60 --rate 2000 [--out cost.json]

The CLI is the one tests run (tests/faulty_cli.py: the checkout as the proxytune package, no fault set).
CPU is read from /proc every second: the watcher's utime + stime and those of every live
descendant, plus what its reaped children used (cutime + cstime): the sum only grows, so the
span's share of one core is (last - first) / wall. Its BPF programs run in the context of whatever
task hits their tracepoint (the proxy, wrk, the kernel's threads), so their cost is read apart, from
the kernel's own counters (kernel.bpf_stats_enabled = 1 for the run, restored after; it adds two
clock reads per program run, so the figure is an upper bound): run_time_ns of every program a
tracer of the watcher holds, read every POLL_S (a session replaced, at a reload or when its program
changes, takes up to POLL_S of its old programs' runs with it: under 1 % of the hour). The proxy's CPU is beside it.
The recorder is then read back: windows by status and the episodes a healthy proxy should not have.
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
sys.path.insert(0, str(HERE))
import faulty_cli  # noqa: E402,F401  (the checkout as the proxytune package, no fault set)
from proxytune.probes import bpfstats, episodes, recorder  # noqa: E402
from proxytune.reports import fingerprint  # noqa: E402

POLL_S = 5
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


def anon_mib(pid: int) -> float:
    """The part of RSS the host cannot take back without killing it: anonymous pages (RssAnon). The
    rest is file pages (bpftrace's LLVM and clang libraries, mostly), clean and reclaimable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def watcher_cpu(pid: int) -> float:
    return sum(watcher_parts(pid).values())


def watcher_parts(pid: int) -> dict[str, float]:
    """The watcher's CPU so far by where it went: itself (in user space and in the kernel: sock_diag
    walks and /proc reads are kernel time), the children it reaped, each live descendant by name
    (bpftrace, perf)."""
    f = stat(pid) or ["0"] * 15
    parts = {"watcher user": int(f[11]) / CLK, "watcher kernel": int(f[12]) / CLK,
             "reaped children": (int(f[13]) + int(f[14])) / CLK}
    for k in descendants(pid):
        try:
            name = Path(f"/proc/{k}/comm").read_text().strip()
        except OSError:
            continue
        parts[name] = parts.get(name, 0.0) + cpu_s(k)
    return parts


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


class BpfRunTime:
    """The run time of every BPF program held by a tracer the watcher runs, summed over the span:
    programs loaded before the span count from their reading at its start, later ones from 0."""

    def __init__(self, watcher: int):
        self.watcher, self.first, self.last, self.names = watcher, {}, {}, {}

    def read(self, baseline: bool = False) -> None:
        for pid in descendants(self.watcher):
            if (stat(pid) or [""])[0] == "Z":
                continue
            for prog in bpfstats.programs(pid):
                key = (pid, prog["id"])
                self.last[key] = (prog["run_time_ns"], prog["run_cnt"])
                if prog["attached"] != "?":
                    self.names[key] = prog["attached"]
                if baseline:
                    self.first[key] = self.last[key]

    def seconds(self) -> float:
        return sum(ns - self.first.get(k, (0, 0))[0] for k, (ns, _) in self.last.items()) / 1e9

    def by_probe(self) -> dict[str, dict]:
        """Per attach point over the span: runs, seconds, and ns a run (bpf_stats' own two clock reads in it)."""
        out: dict[str, list[int]] = {}
        for k, (ns, n) in self.last.items():
            ns0, n0 = self.first.get(k, (0, 0))
            got = out.setdefault(self.names.get(k, "?"), [0, 0])
            got[0] += ns - ns0
            got[1] += n - n0
        return {name: {"runs": n, "seconds": round(ns / 1e9, 3), "ns_per_run": round(ns / n) if n else None}
                for name, (ns, n) in sorted(out.items(), key=lambda kv: -kv[1][0])}


def wrk_rate(load: subprocess.Popen) -> float | None:
    """wrk's achieved rate over its whole run (it prints its summary on SIGINT)."""
    load.send_signal(signal.SIGINT)
    out = load.communicate(timeout=30)[0]
    line = next((l for l in out.splitlines() if l.startswith("Requests/sec:")), None)
    return float(line.split()[1]) if line else None


def recorded(state: Path) -> dict:
    """Windows by status and the episodes of the span, as watch history folds them."""
    recs = recorder.read(state / "watch", whole=False).records
    statuses = {}
    for r in recs:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    eps = [episodes.summary(e) for e in episodes.fold(recs)]
    return {"windows": statuses, "episodes": [(e["finding"], e["severity"]) for e in eps]}


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
        bpf = BpfRunTime(w.pid)
        bpf.read(baseline=True)
        t0, c0, p0 = time.monotonic(), watcher_cpu(w.pid), cpu_s(hp.pid)
        parts0 = watcher_parts(w.pid)
        peak_self = peak_all = peak_anon = 0.0
        while time.monotonic() - t0 < minutes * 60:
            time.sleep(1.0)
            if w.poll() is not None:
                raise RuntimeError(f"the watcher exited: {w.stderr.read()[-500:]}")
            peak_self = max(peak_self, rss_mib(w.pid))
            tree = [w.pid, *descendants(w.pid)]
            peak_all = max(peak_all, sum(rss_mib(k) for k in tree))
            peak_anon = max(peak_anon, sum(anon_mib(k) for k in tree))
            if int(time.monotonic() - t0) % POLL_S == 0:
                bpf.read()
        bpf.read()
        wall, c1, p1 = time.monotonic() - t0, watcher_cpu(w.pid), cpu_s(hp.pid)
        parts = {k: round(v - parts0.get(k, 0.0), 2) for k, v in watcher_parts(w.pid).items()}
        w.send_signal(signal.SIGTERM)                # as `systemctl stop` ends it
        _, err = w.communicate(timeout=120)
        files_ = len(list((tmp / "state" / "watch").glob("*")))
        bpf_s = bpf.seconds()
        return {"minutes": round(wall / 60, 2), "window_s": window, "rate_per_s": rate, "connections": conns,
                "watcher_cpu_s": round(c1 - c0, 2), "watcher_cpu_by_part_s": parts,
                "bpf_run_time_s": round(bpf_s, 2), "bpf_by_probe": bpf.by_probe(),
                "watcher_core_share": round((c1 - c0 + bpf_s) / wall, 5),
                "wrk_requests_per_s": wrk_rate(load),
                "proxy_core_share": round((p1 - p0) / wall, 4),
                # the probes' run time against the proxy's own CPU over the span: per request, the share the
                # tracepoints add to what a request costs (an upper bound: some runs are other tasks')
                "bpf_per_request_share": round(bpf_s / (p1 - p0), 4) if p1 > p0 else None,
                "watcher_rss_peak_mib": round(peak_self, 1), "with_tracers_rss_peak_mib": round(peak_all, 1),
                "with_tracers_anon_peak_mib": round(peak_anon, 1),
                "recorder_bytes": du(tmp / "state" / "watch"), "recorder_files": files_,
                **recorded(tmp / "state"), "watcher_said": err.strip().splitlines()[-5:]}
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
    # started from a script's background job, SIGINT is ignored, and the children would inherit that:
    # wrk prints its summary on SIGINT
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.geteuid() != 0 or not all(map(shutil.which, ("haproxy", "wrk", "bpftrace"))):
        print("needs root, haproxy, wrk and bpftrace", file=sys.stderr)
        return 2
    with bpfstats.enabled() as why_not:
        if why_not:
            print(f"BPF run time cannot be read: {why_not}", file=sys.stderr)
            return 2
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        result = {"command": " ".join(["tests/watch_cost.py", *sys.argv[1:]]), "started_utc": started,
                  "host": fingerprint.fingerprint(), **run(a.minutes, a.rate, a.window, a.connections)}
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What this host lets us observe, each with what its absence costs.

Every probe degrades on its own: a missing tracepoint drops one script, no
hardware counters sends cache misses to cachegrind, no kprobes changes
nothing (the catalog needs none). kprobes are tested by attaching one, not
by trusting `bpftrace --info`.
"""

import os
import shutil
import subprocess
from pathlib import Path

from proxytune.core.capability import Capability, no, perf_counts, yes
from proxytune.core.errors import ProxytuneError
from proxytune.core.invocation import command, needs_root

from . import bpftrace

KPROBE_TEST = "kprobe:vfs_read { exit(); } interval:ms:300 { exit(); }"


def _run(argv, timeout=20) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None


def _is_dir(path: Path) -> bool | None:
    """None when we may not look (tracefs is root-only)."""
    try:
        return path.is_dir()
    except PermissionError:
        return None


def ensure_tracefs() -> Capability:
    """tracefs mounted at /sys/kernel/tracing; mounts it when root."""
    seen = _is_dir(bpftrace.TRACING / "events")
    if seen:
        return yes("mounted at /sys/kernel/tracing")
    if seen is None:
        return no("/sys/kernel/tracing is readable by root only")
    if os.geteuid() != 0:
        return no("not mounted, and mounting it needs root")
    p = _run(["mount", "-t", "tracefs", "nodev", str(bpftrace.TRACING)])
    if p and p.returncode == 0 and (bpftrace.TRACING / "events").is_dir():
        return yes("mounted it at /sys/kernel/tracing")
    return no(f"mount -t tracefs failed: {(p.stderr.strip() if p else 'mount not found')}")


def require_tracefs() -> None:
    """Stop with the real cause when tracepoints cannot be used: tracefs readable by root only
    (not root: needs root), not mounted, or unreadable even to root; never 'tracepoints missing'."""
    tracefs = ensure_tracefs()
    if tracefs.ok:
        return
    if os.geteuid() != 0:
        raise needs_root(f"tracefs: {tracefs.why} (bpftrace attaches its tracepoints through it)")
    raise ProxytuneError(f"tracefs is not available: {tracefs.why}",
                         "mount it (mount -t tracefs nodev /sys/kernel/tracing); in a container, the host must "
                         "allow it")


def kprobes() -> Capability:
    if not shutil.which("bpftrace") or os.geteuid() != 0:
        return no("not tested (needs bpftrace and root)")
    p = _run(["bpftrace", "-e", KPROBE_TEST], timeout=30)
    err = bpftrace._clean(p.stderr) if p else "timed out"
    if p and p.returncode == 0 and "Attaching" in p.stdout + (p.stderr or "") and "ERROR" not in err:
        return yes("attached kprobe:vfs_read")
    return no(f"cannot attach kprobe:vfs_read ({err.splitlines()[-1] if err else 'failed'}); the catalog needs none")


def hardware_counters() -> Capability:
    counts = perf_counts("instructions,L1-dcache-load-misses")
    if counts.ok or not shutil.which("perf"):
        return counts
    return no("not supported here (a VM?): cache misses come from cachegrind (`probe cachemiss -- CMD`)")


def perf_sampling() -> Capability:
    if not shutil.which("perf"):
        return no("perf is not installed (Debian: linux-perf): no CPU hotspots")
    # -B --no-bpf-event: the check needs no build ids and no BPF side-band thread (its exit took 1.1 s, not 0.13)
    p = _run(["perf", "record", "-e", "cpu-clock", "-F", "99", "-a", "-N", "-B", "--no-bpf-event", "-o", "/dev/null",
              "-q", "--", "true"])
    if p and p.returncode == 0:
        return yes("perf record -e cpu-clock -a works")
    if os.geteuid() != 0:
        try:
            level = Path("/proc/sys/kernel/perf_event_paranoid").read_text().strip()
        except OSError:
            level = "?"
        return no(f"system-wide sampling needs root here (kernel.perf_event_paranoid = {level})")
    why = next((l for l in (p.stderr.splitlines() if p else []) if l.strip()), "timed out")
    return no(f"perf record -e cpu-clock -a failed: {why.strip()[:160]}")


INIT_PIDNS_INO = 0xEFFFFFFC       # PROC_PID_INIT_INO: the kernel's initial pid namespace


def container() -> Capability:
    """Whether we run in a container, and whether it shares the host's pid namespace
    (bpftrace and perf report host pids; they match ours only if it does)."""
    marks = []
    if Path("/.dockerenv").exists():
        marks.append("/.dockerenv")
    try:
        if any(w in Path("/proc/1/cgroup").read_text() for w in ("docker", "kubepods", "containerd", "lxc")):
            marks.append("cgroup")
    except OSError:
        pass
    try:
        host_pidns = os.stat("/proc/self/ns/pid").st_ino == INIT_PIDNS_INO
    except OSError:
        host_pidns = None
    where = "container (" + ", ".join(marks) + ")" if marks else "no container detected"
    if host_pidns:
        return Capability(bool(marks), f"{where}; the host's pid namespace: probes see every process of the "
                                       "machine, filtered by pid")
    if host_pidns is False:
        return Capability(bool(marks), f"{where}; own pid namespace: tracers report host pids, which differ from "
                                       "the pids seen here, so attaching by pid may miss the target")
    return Capability(bool(marks), f"{where}; pid namespace unknown")


def all_available(c: dict) -> bool:
    """Whether check() found every capability (`probe caps` exits 1 otherwise); being in a
    container is a fact about the host, not a missing capability."""
    return all(v["ok"] for k, v in c["capabilities"].items() if k != "container")


def require_script(script: bpftrace.Script) -> None:
    """Stop, naming the cause, when script cannot run here: tracefs unusable (an unreadable tracefs
    is not a kernel without the tracepoints), or tracepoints this kernel lacks."""
    require_tracefs()
    if missing := bpftrace.missing_tracepoints(script):
        raise ProxytuneError(f"{script.name} needs tracepoints this kernel lacks: {', '.join(missing)}")


NEEDS_ROOT = ("tracefs", "bpftrace", "kprobes", "perf_sampling")     # what a normal user cannot use here


def check() -> dict:
    """Every capability as {"ok": bool, "detail": str, "needs_root": bool}, plus tracepoints per
    catalog script. Works as any user: what only root may use is said, not crashed on."""
    root = os.geteuid() == 0
    caps = {}
    caps["root"] = Capability(root, "running as root" if root else
                              f"not root: {', '.join(NEEDS_ROOT)}, doctor and probe run/hotspots need root "
                              f"({command('...', root=True)})")
    caps["tracefs"] = ensure_tracefs()
    v = bpftrace.version()
    caps["bpftrace"] = Capability(bool(v), v or "not installed (Debian: bpftrace): no tracepoint probes")
    btf = Path("/sys/kernel/btf/vmlinux").exists()
    caps["btf"] = Capability(btf, "/sys/kernel/btf/vmlinux present" if btf
                             else "no BTF: kfunc probes unavailable (the catalog needs none)")
    caps["kprobes"] = kprobes()
    caps["perf_sampling"] = perf_sampling()
    caps["hardware_counters"] = hardware_counters()
    vg = bool(shutil.which("valgrind"))
    caps["valgrind"] = Capability(vg, "valgrind installed" if vg else
                                  "not installed (Debian: valgrind): no cachegrind fallback")
    caps["container"] = container()
    scripts = {}
    for name, s in bpftrace.catalog().items():
        seen = caps["tracefs"].ok
        missing = bpftrace.missing_tracepoints(s) if seen else []
        scripts[name] = {"ok": seen and not missing and caps["bpftrace"].ok, "tracepoints": s.tracepoints,
                         "missing": missing, "checked": seen, "purpose": s.purpose}
    return {"capabilities": {k: {"ok": c.ok, "detail": c.why, "needs_root": k in NEEDS_ROOT + ("root",) and not root}
                             for k, c in caps.items()}, "scripts": scripts}

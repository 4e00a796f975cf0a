"""The host fingerprint every result carries, so results from different
hosts can stand side by side: kernel, OS, CPU, cores, memory,
virtualisation, and the filesystem of each path a result used."""

import os
import platform
import shutil
import subprocess
from pathlib import Path


def _first(path: str, prefix: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip() if ":" in line else line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return None


def virtualisation() -> str:
    """Both signals: systemd-detect-virt (container or VM) and the CPU's hypervisor flag."""
    signals = []
    if shutil.which("systemd-detect-virt"):
        out = subprocess.run(["systemd-detect-virt"], capture_output=True, text=True).stdout.strip()
        if out and out != "none":
            signals.append(out)
    flags = _first("/proc/cpuinfo", "flags") or ""
    if "hypervisor" in flags.split():
        signals.append("vm (cpu hypervisor flag)")
    return ", ".join(signals) or "none"


def filesystem_of(path: str) -> dict:
    """Filesystem type, device and options of the mount holding `path`."""
    real = os.path.realpath(path)
    best = None
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, right = line.split(" - ", 1)
            f, r = left.split(), right.split()
            mp = f[4].replace("\\040", " ")
            if real == mp or real.startswith(mp.rstrip("/") + "/"):
                if best is None or len(mp) >= len(best["mountpoint"]):
                    best = {"path": path, "mountpoint": mp, "fstype": r[0], "device": r[1],
                            "options": f[5]}
    except OSError:
        pass
    return best or {"path": path, "fstype": "unknown"}


def fingerprint(paths: list[str] | None = None) -> dict:
    mem = _first("/proc/meminfo", "MemTotal")
    return {
        "hostname": platform.node(),
        "os": _first("/etc/os-release", "PRETTY_NAME=") or platform.system(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "cpu_model": _first("/proc/cpuinfo", "model name") or platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "memory_kib": int(mem.split()[0]) if mem else None,
        "virtualised": virtualisation(),
        "filesystems": [filesystem_of(p) for p in (paths or [])],
    }

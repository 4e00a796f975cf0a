"""What a static export needs to know about the host it is made on.

A file cannot say "at least": written exactly, an at-least value lowers a
host that already has more. So sysctl.d (and the parts of tuned that have
no modifier) are computed against the exporting host: max(current, wanted)
for at-least, min for at-most, a widened range for covers, and a setting
the host already meets is left out. The file says which host that was.
Also here: which tuned this host runs and what it recommends.
"""

import platform
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .model import DRIFT, MET
from .values import render

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TUNED_DIRS = ("/etc/tuned", "/etc/tuned/profiles", "/usr/lib/tuned", "/usr/lib/tuned/profiles")
DEFAULT_TUNED_BASE = "throughput-performance"


@dataclass
class Line:
    """One setting as a static file should carry it on this host."""
    value: str | None      # what to write; None: leave the setting out
    note: str              # why, for the file's comments
    readable: bool = True  # False: the knob is absent (or unreadable) on this host


def computed(settings, host, os_name: str) -> dict[str, Line] | None:
    """address -> Line, evaluated on this host; None when the host cannot
    evaluate the profile (another OS): the caller writes the profile's values."""
    if host is None or host.os != os_name:
        return None
    from .plan import evaluate
    out = {}
    for s in settings:
        c = evaluate(s, os_name, host)
        if c.status not in (MET, DRIFT):
            out[s.address] = Line(None, f"not readable here ({c.status}: {c.note}): left out", readable=False)
        elif s.mode == "value":
            out[s.address] = Line(render(s.wanted), "")
        elif c.status == MET:
            out[s.address] = Line(None, f"already {c.current_text()} here (wants {s.wanted_text}): left out, "
                                        "so loading this file never lowers it")
        elif c.status == DRIFT:
            out[s.address] = Line(render(c.target), f"{c.current_text()} here, wants {s.wanted_text}: "
                                                      f"{render(c.target)} computed for this host")
    return out


def computed_on(host) -> str:
    return (f"# Computed on {platform.node()} (kernel {platform.release()}) at "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} from its current values:\n"
            "# at-least settings are written as max(current, wanted), at-most as min(current, wanted),\n"
            "# ranges widened to cover the wanted one, and what this host already meets is left out.\n"
            "# Valid for this host only: regenerate it on each host (`proxytune tune export` there),\n"
            "# or let `proxytune fleet apply --persist` run proxytune on every host instead.\n")


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def tuned_version() -> tuple[int, ...] | None:
    """The installed tuned's version, from `tuned-adm --version`."""
    if not shutil.which("tuned-adm"):
        return None
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", _run(["tuned-adm", "--version"]))
    return tuple(int(x) for x in m.groups() if x is not None) if m else None


def tuned_profile_dir(version: tuple[int, ...] | None, name: str = "proxytune") -> str:
    """tuned < 2.24 reads /etc/tuned/NAME; 2.24 and later /etc/tuned/profiles/NAME."""
    return f"/etc/tuned/profiles/{name}" if version and version >= (2, 24) else f"/etc/tuned/{name}"


def tuned_base(wanted: str | None = None) -> tuple[str, str]:
    """(base profile, where it came from): --tuned-include, else what
    `tuned-adm recommend` names when that profile exists here, else
    throughput-performance."""
    if wanted:
        return wanted, "chosen with --tuned-include"
    if shutil.which("tuned-adm"):
        first = (_run(["tuned-adm", "recommend"]).strip().splitlines() or [""])[0].strip()
        if NAME.fullmatch(first) and any((Path(d) / first / "tuned.conf").is_file() for d in TUNED_DIRS):
            return first, f"`tuned-adm recommend` on {platform.node()}"
    return DEFAULT_TUNED_BASE, "tuned's usual base for servers (no recommendation available here)"

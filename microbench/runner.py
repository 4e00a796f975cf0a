"""Run a harness: one process per measurement point, JSON back, with a
progress bar over the whole sweep and the exact command kept with each point."""

import json
import subprocess
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from proxytune.core.errors import ProxytuneError


def run_json(argv: list[str], timeout: int = 300) -> dict:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise ProxytuneError(f"{Path(argv[0]).name} printed no JSON (exit {proc.returncode}): "
                             f"{(proc.stderr or proc.stdout).strip()[:200]}")
    if "error" in doc:
        raise ProxytuneError(f"{Path(argv[0]).name}: {doc['error']}", " ".join(map(str, argv)))
    doc["command"] = " ".join(str(a) for a in argv[1:])
    return doc


def progress(quiet: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), disable=quiet, transient=True)

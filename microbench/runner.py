"""Run a harness: one process per measurement point, JSON back, with a
progress bar over the whole sweep and the exact command kept with each point.

A harness that fails to build, crashes, hangs or prints no JSON raises
HarnessError; the benches catch it and record the part it hit as
{"available": false, "reason": ...}, so their own JSON never breaks."""

import contextlib
import json
import signal
import subprocess
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from proxytune.core.errors import ProxytuneError


class HarnessError(ProxytuneError):
    """A C harness failed to build, crashed, hung or printed no JSON."""


def run_json(argv: list[str], timeout: int = 300) -> dict:
    name = Path(argv[0]).name
    try:
        proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"{name} did not finish within {timeout} s", " ".join(map(str, argv))) from None
    except OSError as e:
        raise HarnessError(f"{name} could not run: {e.strerror or e}", " ".join(map(str, argv))) from None
    try:
        doc = json.loads(proc.stdout)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except ValueError:
        how = (f"was killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
               else f"printed no JSON (exit {proc.returncode})")
        raise HarnessError(f"{name} {how}: {(proc.stderr or proc.stdout).strip()[:200]}",
                           " ".join(map(str, argv))) from None
    if "error" in doc:
        raise HarnessError(f"{name}: {doc['error']}", " ".join(map(str, argv)))
    doc["command"] = " ".join(str(a) for a in argv[1:])
    return doc


def unavailable(result: dict, err: HarnessError) -> dict:
    """A bench's result in which nothing could be measured: its skeleton and why."""
    return {**result, "available": False, "reason": err.message}


def failed_point(result: dict, where: dict, err: HarnessError) -> None:
    """Record a measurement the harness could not make, in result["unavailable_points"]."""
    result.setdefault("unavailable_points", []).append({**where, "available": False, "reason": err.message})


_step_sink = None      # set by steps_to(): a display that shows the current step itself


class _Forwarding(Progress):
    """A bar that also hands each step's description and count to the report's section display."""

    def update(self, task_id, **kwargs):
        super().update(task_id, **kwargs)
        self._forward(task_id)

    def advance(self, task_id, advance=1):
        super().advance(task_id, advance)
        self._forward(task_id)

    def _forward(self, task_id):
        if _step_sink is not None:
            t = self._tasks[task_id]
            _step_sink(t.description, t.completed, t.total)


@contextlib.contextmanager
def steps_to(sink):
    """While inside, benches draw no bar of their own: their steps go to sink(description, done, total)."""
    global _step_sink
    _step_sink = sink
    try:
        yield
    finally:
        _step_sink = None


def progress(quiet: bool) -> Progress:
    return _Forwarding(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                       TimeElapsedColumn(), disable=quiet or _step_sink is not None, transient=True)

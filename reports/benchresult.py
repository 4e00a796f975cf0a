"""A bench result as a file: wrapped in the result envelope (`proxytune schema`) and stored
where the user said, else as proxytune-results/NAME-STAMP.json in the working directory,
through the safe file layer (no symlink followed, a directory others cannot swap names in);
and whether it counts as failed."""

import json
import time
from pathlib import Path

from proxytune.tune import files

from .schema import envelope


def store(name: str, data: dict, output: Path | None) -> tuple[dict, Path]:
    """(the result document, where it was written)."""
    doc = envelope("bench", data)
    path = output or Path("proxytune-results") / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    files.write_output(path, json.dumps(doc, indent=1) + "\n")
    return doc, path


def failure(data: dict) -> str | None:
    """Why the bench failed (its exit is 2): the mechanism is unavailable here, or measurements
    failed (the first one's reason); None when every point was measured."""
    failed = data.get("unavailable_points", [])
    if data.get("available") is False or failed:
        return data.get("reason") or f"{len(failed)} measurement(s) failed, first: {failed[0]['reason']}"
    return None

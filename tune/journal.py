"""The apply journal: old values written down before anything changes.

One JSON file per apply under STATE_DIR/journal/, rewritten atomically
after every step, so that `rollback` can restore exactly what was there,
even when the apply was killed half-way (every step's old value is in the
file before the first step runs; restoring a step that never ran is a no-op).
"""

import json
import os
import time
from pathlib import Path

from .errors import ProxytuneError
from .files import atomic_write

APPLYING, APPLIED, UNDONE, ROLLED_BACK, ROLLBACK_FAILED = (
    "applying", "applied", "failed-undone", "rolled-back", "rollback-incomplete")
OPEN_STATES = (APPLYING, APPLIED, ROLLBACK_FAILED)


def directory(state_dir: Path) -> Path:
    return Path(state_dir) / "journal"


def new_entry(profile: str, os_name: str, steps: list[dict]) -> dict:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return {"id": f"{stamp}-{os.getpid()}", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "profile": profile, "os": os_name, "state": APPLYING, "done": 0, "steps": steps}


def save(state_dir: Path, entry: dict) -> None:
    try:
        atomic_write(directory(state_dir) / f"{entry['id']}.json", json.dumps(entry, indent=1) + "\n", 0o600)
    except PermissionError:
        raise ProxytuneError(f"cannot write the journal under {state_dir}: permission denied",
                             "run as root, or set PROXYTUNE_STATE_DIR")


def entries(state_dir: Path) -> list[dict]:
    """All journal entries, oldest first."""
    out = []
    for f in sorted(directory(state_dir).glob("*.json")):
        try:
            out.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise ProxytuneError(f"unreadable journal entry {f}: {e}", "move it aside and retry")
    return sorted(out, key=lambda e: e["id"])


def open_entries(state_dir: Path) -> list[dict]:
    return [e for e in entries(state_dir) if e["state"] in OPEN_STATES]


def find(state_dir: Path, entry_id: str | None) -> dict:
    if entry_id:
        for e in entries(state_dir):
            if e["id"] == entry_id:
                return e
        raise ProxytuneError(f"no journal entry {entry_id}", "see `proxytune tune history`")
    pending = open_entries(state_dir)
    if not pending:
        raise ProxytuneError("nothing to roll back: no applied or interrupted change in the journal",
                             f"journal: {directory(state_dir)}")
    return pending[-1]

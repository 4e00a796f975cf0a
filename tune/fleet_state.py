"""What a fleet apply reached, so `fleet rollback` can undo it later: one
JSON file per run under STATE_DIR/fleet/runs/, holding each host's journal
entry id (the host's own journal does the restoring)."""

import json
import os
import re
import time
from pathlib import Path

from proxytune.core.errors import ProxytuneError
from .files import atomic_write

RUN_ID = re.compile(r"\d{8}T\d{6}-\d+")


def runs_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "fleet" / "runs"


def new_run(profile: str, inventory: str, hosts: list[str]) -> dict:
    return {"id": f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "profile": profile,
            "inventory": str(inventory), "targets": hosts, "state": "applying", "hosts": {}}


def save(state_dir: Path, run: dict) -> None:
    try:
        atomic_write(runs_dir(state_dir) / f"{run['id']}.json", json.dumps(run, indent=1) + "\n", 0o600)
    except (OSError, ProxytuneError) as e:     # permission, a full disk, a file where the directory goes
        why = e.message if isinstance(e, ProxytuneError) else (e.strerror or e)
        raise ProxytuneError(f"cannot record the fleet run under {state_dir}: {why}",
                             "run as root, or set PROXYTUNE_STATE_DIR; each host's own journal still has its entry")


def pending(run: dict) -> dict[str, str]:
    """host -> journal id of every host this run changed and nobody undid yet."""
    hosts = run.get("hosts") if isinstance(run.get("hosts"), dict) else {}
    return {h: r["journal"] for h, r in hosts.items()
            if isinstance(r, dict) and isinstance(r.get("journal"), str) and not r.get("rolled_back")}


def last_open(state_dir: Path) -> dict:
    """The newest fleet apply with something left to roll back."""
    found = []
    for f in sorted(runs_dir(state_dir).glob("*.json")):
        if not RUN_ID.fullmatch(f.stem):
            continue
        try:
            run = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ProxytuneError(f"unreadable fleet run record {f}: {e}", "move it aside and retry")
        if isinstance(run, dict) and run.get("id") == f.stem and pending(run):
            found.append(run)
    if not found:
        raise ProxytuneError("nothing to roll back: no fleet apply on record",
                             f"fleet runs are recorded in {runs_dir(state_dir)}")
    return max(found, key=lambda r: r["id"])

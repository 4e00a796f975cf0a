"""What a fleet apply reached, so `fleet rollback` can undo it later: one
JSON file per run under STATE_DIR/fleet/runs/ (every directory 0700), holding
each host's journal entry id (the host's own journal does the restoring).

Runs are ordered by a sequence number taken under a lock, never by a clock: two
applies in the same second, or a clock stepped back, still order right. A host
is recorded when its apply starts, with its journal's high-water mark, so one
whose answer never arrived or was garbage can still be found and undone.
"""

import fcntl
import json
import os
import re
import stat
import time
from contextlib import contextmanager
from pathlib import Path

from proxytune.core.errors import ProxytuneError
from . import journal
from .files import atomic_write
from .fleet_result import JOURNAL_ID_RE

RUN_ID = re.compile(r"(\d{1,12})-\d{8}T\d{6}")
OPEN = ("applied", "interrupted", "rollback-incomplete")
HINT = "run as root, or set PROXYTUNE_STATE_DIR; each host's own journal still has its entry"


def runs_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "fleet" / "runs"


def _private_dirs(state_dir: Path) -> Path:
    """STATE_DIR, STATE_DIR/fleet and its runs/: real directories of ours, 0700."""
    try:
        journal.ensure_dirs(state_dir, journal_too=False)
        for d in (Path(state_dir) / "fleet", runs_dir(state_dir)):
            try:
                os.mkdir(d, 0o700)
            except FileExistsError:
                pass
            journal.vet_dir(d)
            os.chmod(d, 0o700, follow_symlinks=False)
    except OSError as e:
        raise ProxytuneError(f"cannot record the fleet run under {state_dir}: {e.strerror or e}", HINT)
    except ProxytuneError as e:
        raise ProxytuneError(f"cannot record the fleet run under {state_dir}: {e.message}", HINT)
    return runs_dir(state_dir)


@contextmanager
def _sequence_lock(runs: Path):
    fd = os.open(runs / ".seq.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or os.fstat(fd).st_uid != os.geteuid():
            raise ProxytuneError(f"refusing {runs / '.seq.lock'}: not a plain file of ours", "remove it")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _seq_of(name: str) -> int | None:
    m = RUN_ID.fullmatch(name)
    return int(m.group(1)) if m else None


def new_run(state_dir: Path, profile: str, inventory: str, hosts: list[str], host_profile: str) -> dict:
    """A run record with the next sequence number, saved before any host is touched."""
    runs = _private_dirs(state_dir)
    with _sequence_lock(runs):
        seq = max((s for f in runs.glob("*.json") if (s := _seq_of(f.stem)) is not None), default=0) + 1
        run = {"id": f"{seq}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}", "seq": seq,
               "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "profile": profile,
               "host_profile": host_profile, "inventory": str(inventory), "targets": hosts,
               "state": "applying", "hosts": {}}
        save(state_dir, run)
    return run


def save(state_dir: Path, run: dict) -> None:
    runs = _private_dirs(state_dir)
    try:
        atomic_write(runs / f"{run['id']}.json", json.dumps(run, indent=1) + "\n", 0o600)
    except (OSError, ProxytuneError) as e:     # permission, a full disk, a file where the directory goes
        why = e.message if isinstance(e, ProxytuneError) else (e.strerror or e)
        raise ProxytuneError(f"cannot record the fleet run under {state_dir}: {why}", HINT)


def pending(run: dict) -> dict[str, str]:
    """host -> journal id of every host this run changed and nobody undid yet."""
    hosts = run.get("hosts") if isinstance(run.get("hosts"), dict) else {}
    return {h: r["journal"] for h, r in hosts.items()
            if isinstance(r, dict) and isinstance(r.get("journal"), str) and not r.get("rolled_back")}


def unanswered(run: dict) -> dict[str, int | None]:
    """host -> journal mark (None: unreadable) of every host whose apply started but gave no usable answer."""
    hosts = run.get("hosts") if isinstance(run.get("hosts"), dict) else {}
    return {h: r["mark"] for h, r in hosts.items()
            if isinstance(r, dict) and "mark" in r and (r["mark"] is None or type(r["mark"]) is int)
            and r.get("journal") is None and not r.get("answered") and not r.get("rolled_back")}


def _entries(history_stdout) -> list[dict] | None:
    """The rows of a host's `tune history --json` (a bare list or an envelope), or None."""
    try:
        doc = json.loads(history_stdout or "")
    except (TypeError, ValueError):
        return None
    if isinstance(doc, dict):
        doc = doc.get("data")
        doc = doc.get("entries") if isinstance(doc, dict) else doc
    if not isinstance(doc, list):
        return None
    rows = [r for r in doc if isinstance(r, dict) and type(r.get("seq")) is int and isinstance(r.get("id"), str)
            and re.match(JOURNAL_ID_RE, r["id"])]
    return rows if len(rows) == len(doc) else None


def high_mark(history_stdout) -> int | None:
    """The highest journal sequence number on a host before its apply (0: empty journal)."""
    rows = _entries(history_stdout)
    return None if rows is None else max((r["seq"] for r in rows), default=0)


def open_after(history_stdout, mark: int, profile: str | None) -> list[str] | None:
    """Ids of the open entries after `mark` made with `profile` (a name, or a path's
    run-unique tail starting with /), oldest first; None if unreadable."""
    rows = _entries(history_stdout)
    if rows is None:
        return None
    return [r["id"] for r in sorted(rows, key=lambda r: r["seq"])
            if r["seq"] > mark and r.get("state") in OPEN and isinstance(r.get("profile"), str)
            and (r["profile"] == profile or (profile or " ").startswith("/") and r["profile"].endswith(profile))]


def last_open(state_dir: Path) -> dict:
    """The fleet apply with the highest sequence number that has something left to roll back."""
    found = []
    runs = runs_dir(state_dir)
    for f in sorted(runs.glob("*.json")) if runs.is_dir() else []:
        if _seq_of(f.stem) is None:
            continue
        try:
            run = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise ProxytuneError(f"unreadable fleet run record {f}: {e}", "move it aside and retry")
        if isinstance(run, dict) and run.get("id") == f.stem and (pending(run) or unanswered(run)):
            found.append(run)
    if not found:
        raise ProxytuneError("nothing to roll back: no fleet apply on record",
                             f"fleet runs are recorded in {runs}")
    return max(found, key=lambda r: _seq_of(r["id"]))

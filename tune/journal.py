"""The apply journal: old values written down before anything changes.

One JSON file per apply under STATE_DIR/journal/, rewritten atomically
after every step, so that `rollback` can restore exactly what was there,
even when the apply was killed half-way (every step's old value is in the
file before the first step runs; restoring a step that never ran is a no-op).

Root acts on what these files say, so they are read as untrusted input:
the directories are 0700 and ours, an entry not owned by us or writable by
group/other is refused, and every entry must match SCHEMA. Entries are
ordered by a sequence number kept inside them (allocated under the lock),
never by their file name; the id carries that number, so it is unique even
for two applies by the same pid in the same second.
"""

import json
import os
import re
import stat
import time
from pathlib import Path

import jsonschema

from . import eventlog, files
from proxytune.core.errors import ProxytuneError
from proxytune.core.invocation import command, needs_root
from proxytune.core.procfs import identity, same_process

APPLYING, APPLIED, UNDONE, ROLLED_BACK, ROLLBACK_FAILED = (
    "applying", "applied", "failed-undone", "rolled-back", "rollback-incomplete")
OPEN_STATES = (APPLYING, APPLIED, ROLLBACK_FAILED)
ID_RE = r"[0-9]{8}T[0-9]{6}-[0-9]+-[0-9]+"

_FILE_STATE = {"type": "object", "additionalProperties": False, "required": ["text", "mode", "uid", "gid", "sha256"],
               "properties": {"text": {"type": "string"}, "mode": {"type": "integer", "minimum": 0, "maximum": 0o7777},
                              "uid": {"type": "integer", "minimum": 0}, "gid": {"type": "integer", "minimum": 0},
                              "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}}
_WROTE_FILE = {"type": "object", "required": ["sha256"], "properties": {"sha256": {"type": "string"}}}
_COMMON = {"backend": {"type": "string", "pattern": "^[a-z_]{1,20}$"}, "undone": {"type": "boolean"}}
_STEP = {"oneOf": [
    {"type": "object", "additionalProperties": False, "required": ["kind", "backend", "key", "address", "old", "new"],
     "properties": {**_COMMON, "kind": {"const": "runtime"}, "key": {"type": "string", "maxLength": 300},
                    "address": {"type": "string", "maxLength": 330}, "old": {}, "new": {}, "wrote": {}}},
    {"type": "object", "additionalProperties": False, "required": ["kind", "backend", "path", "old", "new", "wrote"],
     "properties": {**_COMMON, "kind": {"const": "file"}, "path": {"type": "string", "maxLength": 4096},
                    "old": {"oneOf": [{"type": "null"}, _FILE_STATE]}, "new": {"type": "string"},
                    "wrote": _WROTE_FILE, "created_dirs": {"type": "array", "items": {"type": "string"}}}}]}
SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["id", "seq", "created", "profile", "os", "root", "state", "done", "owner", "steps"],
    "properties": {
        "id": {"type": "string", "pattern": f"^{ID_RE}$"},
        "seq": {"type": "integer", "minimum": 1},
        "created": {"type": "string"}, "profile": {"type": "string"}, "os": {"type": "string"},
        "root": {"type": "string", "pattern": "^/"},
        "state": {"enum": [APPLYING, APPLIED, UNDONE, ROLLED_BACK, ROLLBACK_FAILED]},
        "reason": {"type": "string"},
        "done": {"type": "integer", "minimum": 0},
        "writing": {"type": "integer", "minimum": 1},
        "by": {"type": "object", "properties": {"uid": {"type": "integer"}, "user": {"type": "string"},
                                                "sudo_user": {"type": "string"}}},
        "owner": {"type": "object", "required": ["pid", "start", "comm"],
                  "properties": {"pid": {"type": "integer"}, "start": {"type": "integer"},
                                 "comm": {"type": "string"}}},
        "steps": {"type": "array", "items": _STEP},
    },
}


def directory(state_dir: Path) -> Path:
    return Path(state_dir) / "journal"


def ensure_dirs(state_dir: Path, journal_too: bool = True) -> Path:
    """Create (0700, whatever the umask) or vet the state dir (and the journal dir) before writing."""
    state_dir = Path(state_dir)
    for d in (state_dir, directory(state_dir))[:2 if journal_too else 1]:
        ensure_private_dir(d, "the state directory", parents=d == state_dir)
    return state_dir


def ensure_private_dir(d: Path, what: str, parents: bool = False) -> Path:
    """d as a directory of ours, 0700 (made so whatever the umask), never through a symlink."""
    _vet_parents(d, what)
    try:
        if parents:
            d.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        vet_dir(d, what)            # root's own directory, seen by a user: "needs root"
        if isinstance(e, PermissionError) and os.geteuid() != 0:
            raise needs_root(f"cannot create {what} {d} ({e.strerror})") from None
        raise ProxytuneError(f"cannot create {what} {d}: {e.strerror}",
                             f"run it as root: {command(root=True)}" if os.geteuid() else "check that filesystem (full? read-only?)")
    vet_dir(d, what)
    if stat.S_IMODE(os.lstat(d).st_mode) != 0o700:
        try:
            os.chmod(d, 0o700, follow_symlinks=False)
        except OSError as e:
            raise ProxytuneError(f"cannot make {d} private (0700): {e.strerror}")
    return d


def _vet_parents(d: Path, what: str) -> None:
    """Refuse d when a directory above it (as named, and where links lead) is another user's or
    others can write it (sticky /tmp aside): they could rename our private directory away at any
    moment, and a second run would take a fresh lock or find no journal."""
    for p in {*Path(os.path.abspath(d)).parents, *Path(os.path.realpath(d)).parents}:
        try:
            st = os.stat(p)
        except (FileNotFoundError, PermissionError):
            continue            # made below (ours), or not ours to reach: mkdir says so
        open_to_others = st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != os.getegid())
        if st.st_uid not in (0, os.geteuid()) or (open_to_others and not st.st_mode & stat.S_ISVTX):
            raise ProxytuneError(f"refusing {what} {d}: {p} is owned by uid {st.st_uid}, "
                                 f"mode {stat.S_IMODE(st.st_mode):04o}",
                                 "choose a directory whose parents only root (or you) can change")


def vet_dir(d: Path, what: str = "the state directory") -> bool:
    """True when d is a safe directory of ours; False when absent; refuse anything else."""
    try:
        st = os.lstat(d)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except PermissionError:
        raise _needs_root(d, what) from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ProxytuneError(f"refusing {what} {d}: it is a symlink or not a directory",
                             "it must be a real directory owned by root, mode 0700")
    if st.st_uid != os.geteuid() and st.st_uid == 0:
        raise _needs_root(d, what)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ProxytuneError(f"refusing {what} {d}: owned by uid {st.st_uid}, "
                             f"mode {stat.S_IMODE(st.st_mode):04o}",
                             f"it must be owned by uid {os.geteuid()} and not group/other writable")
    return True


def _needs_root(d: Path, what: str) -> ProxytuneError:
    """Root's own directory seen by another user: root is the cause (never a hint at a chown)."""
    return needs_root(f"{what} {d} is root's (running as uid {os.geteuid()})")


def new_entry(state_dir: Path, profile: str, os_name: str, root: Path, steps: list[dict]) -> dict:
    """A fresh entry; call it while holding the lock, so that the sequence number is unique."""
    seq = max((e["seq"] for e in entries(state_dir)), default=0) + 1
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return {"id": f"{stamp}-{os.getpid()}-{seq}", "seq": seq,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "profile": profile, "os": os_name, "root": str(root), "state": APPLYING, "done": 0,
            "owner": identity(os.getpid()) or {"pid": os.getpid(), "start": -1, "comm": ""},
            "by": eventlog.who(), "steps": steps}


def save(state_dir: Path, entry: dict) -> None:
    jdir = directory(ensure_dirs(state_dir))
    files.write(jdir / f"{entry['id']}.json", json.dumps(entry, indent=1) + "\n", root=jdir, mode=0o600)


def entries(state_dir: Path) -> list[dict]:
    """All journal entries, oldest first (by sequence number); any doubtful one is refused."""
    jdir = directory(state_dir)
    if not vet_dir(Path(state_dir)) or not vet_dir(jdir):
        return []
    out = [load(f) for f in jdir.iterdir() if f.suffix == ".json"]
    return sorted(out, key=lambda e: e["seq"])


def load(f: Path) -> dict:
    """One entry file, checked: ours, not writable by others, not a link, the right shape."""
    hint = "move it out of the journal directory and retry"
    try:
        fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ProxytuneError(f"refusing journal entry {f}: {e.strerror}", hint)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise ProxytuneError(f"refusing journal entry {f}: owned by uid {st.st_uid}, "
                                 f"mode {stat.S_IMODE(st.st_mode):04o} (must be ours and not group/other writable)", hint)
        raw = fh.read(16 << 20)
    try:
        entry = json.loads(raw)
        jsonschema.validate(entry, SCHEMA)
    except (ValueError, jsonschema.ValidationError) as e:
        what = e.message if isinstance(e, jsonschema.ValidationError) else str(e)
        raise ProxytuneError(f"refusing journal entry {f}: wrong shape: {what[:200]}", hint)
    if f.name != f"{entry['id']}.json":
        raise ProxytuneError(f"refusing journal entry {f}: its id is {entry['id']}", hint)
    return entry


def owner_alive(entry: dict) -> bool:
    return same_process(entry["owner"])


def status(entry: dict) -> str:
    """The state, with 'applying' split into 'in progress' (owner alive) and 'interrupted'."""
    if entry["state"] != APPLYING:
        return entry["state"]
    return "in-progress" if owner_alive(entry) else "interrupted"


def open_entries(state_dir: Path) -> list[dict]:
    return [e for e in entries(state_dir) if e["state"] in OPEN_STATES]


def find(state_dir: Path, entry_id: str | None) -> dict:
    if entry_id:
        for e in entries(state_dir):
            if e["id"] == entry_id:
                return e
        raise ProxytuneError(f"no journal entry {entry_id!r}", f"see {command('tune history')}")
    pending = open_entries(state_dir)
    if not pending:
        raise ProxytuneError("nothing to roll back: no applied or interrupted change in the journal",
                             f"journal: {directory(state_dir)}")
    return pending[-1]


def refuse_live(entry: dict, doing: str) -> None:
    """Stop when the entry belongs to an apply that is still running."""
    if status(entry) == "in-progress":
        o = entry["owner"]
        raise ProxytuneError(f"{doing} refused: apply {entry['id']} is in progress "
                             f"(pid {o['pid']}, {o['comm']!r}, since {entry['created']})",
                             "wait for it to finish; nothing was changed")


def check_id(entry_id: str | None) -> None:
    if entry_id is not None and not re.fullmatch(ID_RE, entry_id):
        raise ProxytuneError(f"--id {entry_id!r} is not a journal id", f"see {command('tune history')}")

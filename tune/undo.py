"""Undoing journaled steps: only what is still ours, only where the entry may write.

Before a step is undone, what is there now is compared with what apply wrote
(a runtime value read back after writing; a file's sha256). Equal: it is
ours, put the old state back. Equal to the old state: nothing to do.
Anything else was changed by someone since the apply: it is kept and
reported, and undone only with `force`. A step that is done is marked
`undone`, so a partial rollback can be finished later.

A journal entry is input: `check_entry` refuses one whose root is not the
host's, or whose file steps name a path its backend never writes.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from . import backends, files
from proxytune.core.errors import BackendError, NotApplicable, ProxytuneError
from .host import Host


@dataclass
class Undone:
    kept: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.kept and not self.failures


def undo_steps(steps: list[dict], os_name: str, host: Host, force: bool = False) -> Undone:
    """Undo steps newest first; keep going past failures and name them. A step whose write was
    issued but never returned has no `wrote`: its old state is put back where it differs."""
    result = Undone()
    for step in reversed(steps):
        if step.get("undone"):
            continue
        try:
            kept, notes = (_undo_file(step, host, force) if step["kind"] == "file"
                           else backends.get(os_name, step["backend"], host).undo(
                               step["key"], step["old"], step.get("wrote"), force))
        except (ProxytuneError, NotApplicable, OSError) as e:
            result.failures.append(f"{label(step)}: {getattr(e, 'message', None) or e}")
            continue
        result.kept += kept
        result.notes += notes
        step["undone"] = not kept
    return result


def _undo_file(step: dict, host: Host, force: bool) -> tuple[list[str], list[str]]:
    path = Path(step["path"])
    now = files.read_for_edit(path, host.root)
    old = files.FileState.from_json(step["old"])
    now_sha, old_sha = now and now.sha256, old and old.sha256
    if now_sha != old_sha and now_sha != step["wrote"]["sha256"] and not force:
        what = f"sha256 {now_sha[:12]}" if now else "removed"
        return [f"kept: {path} was changed since the apply (now {what})"], []
    if now_sha != old_sha:
        files.restore(path, old, [], host.root)
    for d in reversed(step.get("created_dirs", [])):
        if not files.remove_empty_dir(Path(d), host.root):
            return [], [f"kept the directory {d}: it is not empty"]
    return [], []


def check_entry(entry: dict, host: Host) -> None:
    """Refuse an entry made under another root, or one that names files its backends never write."""
    root = Path(entry["root"])
    if os.path.realpath(root) != os.path.realpath(host.root):
        raise ProxytuneError(f"journal entry {entry['id']} was applied with --root {root}, not {host.root}",
                             f"rerun with --root {root}")
    for step in entry["steps"]:
        be = backends.get(entry["os"], step["backend"], host)
        if step["kind"] == "runtime":
            key = step["key"]
            if step["address"] != f"{step['backend']}:{key}" or not be.runtime or not key.isprintable():
                raise _bad(entry, f"runtime step {step['address']!r} does not match its backend")
            continue
        rel = _below(step["path"], root, entry)
        if not any(PurePosixPath(rel).match(pattern) for pattern in be.writes):
            raise _bad(entry, f"{step['path']} is not a file the {step['backend']} backend writes")
        for d in step.get("created_dirs", []):
            if not rel.startswith(_below(d, root, entry) + "/"):
                raise _bad(entry, f"created directory {d} is not a parent of {step['path']}")


def _below(path: str, root: Path, entry: dict) -> str:
    """`path` as /REL under root; refused when it is not normalised or leaves the root."""
    if os.path.normpath(path) != path or not path.startswith("/"):
        raise _bad(entry, f"path {path!r} is not a normalised absolute path")
    try:
        rel = "/" + str(PurePosixPath(path).relative_to(root))
    except ValueError:
        raise _bad(entry, f"path {path} is outside the root {root}")
    if rel == "/.":
        raise _bad(entry, f"path {path} is the root itself")
    return rel


def _bad(entry: dict, why: str) -> ProxytuneError:
    return ProxytuneError(f"refusing journal entry {entry['id']}: {why}",
                          "it was not written by proxytune's apply; move it aside")


def after_files(steps: list[dict], os_name: str, host: Host) -> list[str]:
    """Run each file backend's follow-up once (daemon-reload, cap_mkdb)."""
    notes = []
    for kind in dict.fromkeys(s["backend"] for s in steps if s["kind"] == "file"):
        try:
            notes += backends.get(os_name, kind, host).after_files()
        except BackendError as e:
            notes.append(f"{kind}: {e.message}")
    return notes


def label(step: dict) -> str:
    return step.get("address") or step["path"]

"""Execute a plan step by step, journaled; undo on failure; roll back later.

A step is either a runtime write through a backend or a whole-file write.
Both record the old state in the journal before the first step runs. The
environment variable PROXYTUNE_FAULT_AFTER_STEP=N makes apply SIGKILL
itself after step N (0 = right after the journal is written): the fault
injection the crash-safety tests use.
"""

import os
import signal
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from . import backends, journal
from .errors import BackendError, NotApplicable, ProxytuneError
from .files import atomic_write, read_text, restore as restore_file
from .host import Host
from .model import Plan
from .values import as_json, parse, render

FAULT_ENV = "PROXYTUNE_FAULT_AFTER_STEP"


@dataclass
class Outcome:
    entry: dict | None
    steps: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def steps_for(plan: Plan, host: Host, persist: bool) -> tuple[list[dict], list[str]]:
    """The ordered steps of a plan, each with the old state it replaces."""
    steps, notes = [], []
    by_kind = defaultdict(list)
    for change in plan.todo:
        be = backends.get(plan.os, change.setting.backend, host)
        by_kind[change.setting.backend].append(change)
        if be.runtime:
            steps.append({"kind": "runtime", "backend": be.kind, "key": change.setting.key,
                          "address": change.setting.address, "old": be.snapshot(change.setting.key),
                          "new": as_json(change.target)})
    for kind, changes in by_kind.items():
        be = backends.get(plan.os, kind, host)
        if be.runtime and not persist:
            continue
        for path, text in be.file_edits(changes):
            steps.append({"kind": "file", "backend": kind, "path": str(path),
                          "old": read_text(path), "new": text})
        if persist:
            notes += be.persist_notes(changes)
    return [s for s in steps if not (s["kind"] == "file" and s["old"] == s["new"])], notes


def refuse_blocked(plan: Plan) -> None:
    """Stop before anything changes when the plan already knows a setting cannot be applied here."""
    blocked = [c for c in plan.todo if c.note]
    if blocked:
        raise ProxytuneError(f"{blocked[0].setting.address} cannot be applied here: {blocked[0].note}",
                             f"leave it out with --skip '{blocked[0].setting.address}'; nothing was changed")


def apply_plan(plan: Plan, host: Host, persist: bool = False) -> Outcome:
    interrupted = [e for e in journal.open_entries(host.state_dir) if e["state"] == journal.APPLYING]
    if interrupted:
        raise ProxytuneError(f"apply {interrupted[-1]['id']} was interrupted and may be half done",
                             "run `proxytune tune rollback` first")
    steps, notes = steps_for(plan, host, persist)
    if not steps:
        return Outcome(entry=None, notes=notes + ["nothing to change: every selected setting is met"])
    entry = journal.new_entry(plan.profile, plan.os, steps)
    journal.save(host.state_dir, entry)
    _fault_point(0)
    for i, step in enumerate(steps, 1):
        try:
            _do(step, plan.os, host)
        except (ProxytuneError, NotApplicable, OSError) as e:
            reason = getattr(e, "message", None) or str(e)
            failures = _undo_all(steps[:i], plan.os, host)
            entry["state"] = journal.UNDONE
            journal.save(host.state_dir, entry)
            undone = "undid every earlier step" if not failures else f"undo failed for: {'; '.join(failures)}"
            raise ProxytuneError(f"apply failed at {_label(step)}: {reason}; {undone} (journal {entry['id']})",
                                 "nothing stays changed" if not failures else "see `tune rollback`")
        entry["done"] = i
        journal.save(host.state_dir, entry)
        _fault_point(i)
    notes += _after_files(steps, plan.os, host)
    entry["state"] = journal.APPLIED
    journal.save(host.state_dir, entry)
    return Outcome(entry=entry, steps=steps, notes=notes)


def rollback(host: Host, entry_id: str | None = None) -> Outcome:
    entry = journal.find(host.state_dir, entry_id)
    if entry["state"] == journal.ROLLED_BACK:
        raise ProxytuneError(f"journal entry {entry['id']} is already rolled back")
    failures = _undo_all(entry["steps"], entry["os"], host)
    notes = _after_files(entry["steps"], entry["os"], host)
    entry["state"] = journal.ROLLED_BACK if not failures else journal.ROLLBACK_FAILED
    journal.save(host.state_dir, entry)
    return Outcome(entry=entry, steps=entry["steps"], notes=notes, failures=failures)


def _do(step, os_name, host):
    if step["kind"] == "file":
        atomic_write(Path(step["path"]), step["new"])
    else:
        backends.get(os_name, step["backend"], host).write(step["key"], parse(step["new"]))


def _undo(step, os_name, host):
    if step["kind"] == "file":
        restore_file(Path(step["path"]), step["old"])
    else:
        backends.get(os_name, step["backend"], host).restore(step["key"], step["old"])


def _undo_all(steps, os_name, host) -> list[str]:
    """Restore steps newest first; keep going past failures and name them."""
    failures = []
    for step in reversed(steps):
        try:
            _undo(step, os_name, host)
        except (ProxytuneError, NotApplicable, OSError) as e:
            failures.append(f"{_label(step)}: {getattr(e, 'message', None) or e}")
    return failures


def _after_files(steps, os_name, host) -> list[str]:
    notes = []
    for kind in dict.fromkeys(s["backend"] for s in steps if s["kind"] == "file"):
        try:
            notes += backends.get(os_name, kind, host).after_files()
        except BackendError as e:
            notes.append(f"{kind}: {e.message}")
    return notes


def _label(step) -> str:
    return step.get("address") or step["path"]


def describe(step, undo: bool = False) -> str:
    """One line for a step: what changes, from what, to what (reversed for undo)."""
    if step["kind"] == "file":
        if undo:
            return f"{'remove' if step['old'] is None else 'restore'} {step['path']}"
        return f"{'create' if step['old'] is None else 'rewrite'} {step['path']}"
    old = step["old"]
    if isinstance(old, dict):
        old_text = ", ".join(f"{k}={render(tuple(v)) if isinstance(v, list) else v}" for k, v in old.items())
    else:
        old_text = " ".join(str(old).split())
    new_text = render(parse(step["new"]))
    return f"{step['address']}: {new_text} -> {old_text}" if undo else f"{step['address']}: {old_text} -> {new_text}"


def _fault_point(n: int) -> None:
    if os.environ.get(FAULT_ENV) == str(n):
        os.kill(os.getpid(), signal.SIGKILL)

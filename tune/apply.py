"""Execute a plan step by step, journaled; undo on failure or Ctrl-C; roll back later.

A step is either a runtime write through a backend or a whole-file write
(through tune/files.py). Both record the old state in the journal before the
first step runs, and what they wrote (a runtime value read back after
writing, a file's sha256, mode and owner) so that rollback can tell ours
from a later change. apply and rollback hold the state dir's lock.

PROXYTUNE_FAULT_AFTER_STEP=N[:HOW] injects a fault after step N (0 = right
after the journal is first written), for the crash-safety tests: HOW is
kill (default, SIGKILL), stop (SIGSTOP, to hold the lock while a test acts),
int / term (Ctrl-C / SIGTERM), or bug (an unexpected exception). It is
honoured only in a checkout that carries its test suite: the .deb and the
wheel ship no tests/, so no environment stops an installed apply half-way.
"""

import json
import os
import signal
import threading
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import backends, files, journal, lock
from proxytune.core.errors import Interrupted, NotApplicable, ProxytuneError
from .datafiles import PACKAGE_ROOT
from .files import FileState
from .host import Host
from .model import Plan
from .undo import after_files, check_entry, label, undo_steps
from .values import as_json, parse, render

FAULT_ENV = "PROXYTUNE_FAULT_AFTER_STEP"
BACKUP_SUFFIX = ".proxytune.bak"


@dataclass
class Outcome:
    entry: dict | None
    steps: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def steps_for(plan: Plan, host: Host, persist: bool, files_only: bool = False) -> tuple[list[dict], list[str]]:
    """The ordered steps of a plan, each with the old state it replaces. files_only: no runtime
    step, every backend's files (an image being built)."""
    steps, notes = [], []
    by_kind = defaultdict(list)
    for change in plan.todo:
        be = backends.get(plan.os, change.setting.backend, host)
        by_kind[change.setting.backend].append(change)
        if be.runtime and not files_only:
            steps.append({"kind": "runtime", "backend": be.kind, "key": change.setting.key,
                          "address": change.setting.address, "old": be.snapshot(change.setting.key),
                          "new": as_json(change.target)})
    for kind, changes in by_kind.items():
        be = backends.get(plan.os, kind, host)
        if be.runtime and not (persist or files_only):
            continue
        for path, text in be.file_edits(changes):
            if step := _file_step(kind, Path(path), text, host):
                steps.append(step)
        if persist or files_only:
            notes += be.persist_notes(changes)
    return steps, notes


def _file_step(kind: str, path: Path, text: str, host: Host) -> dict | None:
    """A whole-file step; the identity it will have: the file's own, a backup's original's, or 0644 ours."""
    old = files.read_for_edit(path, host.root)
    if old is not None and old.text == text:
        return None
    like = old
    if like is None and path.name.endswith(BACKUP_SUFFIX):
        like = files.read_for_edit(path.with_name(path.name[:-len(BACKUP_SUFFIX)]), host.root)
    mode, uid, gid = (like.mode, like.uid, like.gid) if like else (files.NEW_FILE_MODE, os.geteuid(), os.getegid())
    return {"kind": "file", "backend": kind, "path": str(path), "old": old and old.to_json(), "new": text,
            "wrote": {"sha256": files.digest(text), "mode": mode, "uid": uid, "gid": gid}}


def refuse_blocked(plan: Plan, files_only: bool = False) -> None:
    """Stop before anything changes when the plan already knows a setting cannot be applied here."""
    blocked = [c for c in plan.todo if c.note and not (files_only and _is_runtime(plan, c))]
    if blocked:
        raise ProxytuneError(f"{blocked[0].setting.address} cannot be applied here: {blocked[0].note}",
                             f"leave it out with --skip '{blocked[0].setting.address}'; nothing was changed")


def _is_runtime(plan: Plan, change) -> bool:
    return backends.REGISTRY[(plan.os, change.setting.backend)].runtime


def apply_plan(plan: Plan, host: Host, persist: bool = False, files_only: bool = False,
               confirmed: list[dict] | None = None) -> Outcome:
    """Run the plan's steps. `confirmed`: the steps the user was shown and agreed to; the steps are
    planned again under the lock and must be the same ones, from the same old state, or nothing runs."""
    with lock.hold(host.state_dir, "tune apply"):
        _refuse_open_apply(host)
        steps, notes = steps_for(plan, host, persist, files_only)
        if confirmed is not None:
            refuse_unconfirmed(steps, confirmed)
        if not steps:
            return Outcome(entry=None, notes=notes + ["nothing to change: every selected setting is met"])
        entry = journal.new_entry(host.state_dir, plan.profile, plan.os, host.root, steps)
        with _interrupts_raise():
            journal.save(host.state_dir, entry)        # fails before any change: nothing to undo
            notes += _run(entry, plan.os, host)
        return Outcome(entry=entry, steps=steps, notes=notes)


def _step_key(step: dict) -> tuple:
    return step["kind"], label(step)


def _shown(value) -> str:
    """An old state in a few words: absent, a file by its digest, or the value."""
    if value is None:
        return "absent"
    if isinstance(value, dict) and "sha256" in value:
        mode = f"mode {value['mode']:o}, " if isinstance(value.get("mode"), int) else ""
        owner = f"owner {value['uid']}:{value['gid']}, " if "uid" in value and "gid" in value else ""
        return f"a file with {mode}{owner}sha256 {value['sha256'][:12]}..."
    text = " ".join(value.split()) if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def refuse_unconfirmed(steps: list[dict], confirmed: list[dict]) -> None:
    """One line, nothing changed, when the steps planned now are not exactly the ones confirmed:
    a step nobody saw, a confirmed step no longer needed, or an old value that changed meanwhile."""
    now = {_step_key(s): s for s in steps}
    seen = {_step_key(s): s for s in confirmed}
    for key, step in now.items():
        if key not in seen:
            why = "it now needs a step that was not shown"
        elif json.dumps(step["old"], sort_keys=True, default=str) != json.dumps(seen[key]["old"], sort_keys=True,
                                                                                    default=str):
            why = f"it is now {_shown(step['old'])}, shown as {_shown(seen[key]['old'])}"
        elif step["new"] != seen[key]["new"]:
            why = "the value to write is not the one shown"
        else:
            continue
        _refuse_changed(key[1], why)
    for key in seen.keys() - now.keys():
        _refuse_changed(key[1], "the step shown is no longer needed (changed by someone else?)")


def _refuse_changed(what: str, why: str):
    raise ProxytuneError(f"{what} changed since the plan was shown: {why}; nothing was changed",
                         "look at it, then run `proxytune tune apply` again to see the new plan")


def _refuse_open_apply(host: Host) -> None:
    for e in journal.open_entries(host.state_dir):
        if e["state"] == journal.APPLYING:
            journal.refuse_live(e, "apply")
            raise ProxytuneError(f"apply {e['id']} was interrupted (its pid {e['owner']['pid']} is gone) "
                                 "and may be half done", "run `proxytune tune rollback` first; nothing was changed")


def _run(entry: dict, os_name: str, host: Host) -> list[str]:
    """Every step, the journal saved after each; on any failure or interrupt undo what was done."""
    steps, done = entry["steps"], 0
    try:
        _fault_point(0)
        for i, step in enumerate(steps, 1):
            _do(step, os_name, host)
            entry["done"] = done = i
            journal.save(host.state_dir, entry)
            _fault_point(i)
        notes = after_files(steps, os_name, host)
        entry["state"] = journal.APPLIED
        journal.save(host.state_dir, entry)
        return notes
    except BaseException as e:
        _abandon(entry, steps[:done + 1], os_name, host, e)


def _abandon(entry: dict, steps: list[dict], os_name: str, host: Host, cause: BaseException):
    """Undo the steps done (not itself interruptible), record it, raise one clear error."""
    with _interrupts_ignored():
        result = undo_steps(steps, os_name, host)
        problems = result.failures + result.kept
        entry["state"] = journal.UNDONE if not problems else journal.ROLLBACK_FAILED
        entry["reason"] = reason = _reason(cause)
        try:
            journal.save(host.state_dir, entry)
            recorded = f"journal {entry['id']}"
        except ProxytuneError as e:
            recorded = f"the journal could not record it ({e.message}); {entry['id']} still says applying"
    undone = "undid every step done" if not problems else f"undo incomplete: {'; '.join(problems)}"
    hint = "nothing stays changed" if not problems else "fix the cause, then `proxytune tune rollback --force`"
    where = f" at {label(steps[-1])}" if steps and label(steps[-1]) not in reason else ""
    if isinstance(cause, KeyboardInterrupt):
        raise Interrupted(f"interrupted{where}; {undone} ({recorded})", hint) from None
    if isinstance(cause, (ProxytuneError, NotApplicable, OSError)):
        raise ProxytuneError(f"apply failed{where}: {reason}; {undone} ({recorded})", hint) from cause
    if isinstance(cause, Exception):
        cause.add_note(f"apply stopped{where}; {undone} ({recorded})")
    raise cause


def _reason(e: BaseException) -> str:
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    return getattr(e, "message", None) or getattr(e, "strerror", None) or str(e) or type(e).__name__


def rollback(host: Host, entry_id: str | None = None, force: bool = False) -> Outcome:
    """Undo an entry's steps that are still ours (all with force); 'rolled-back' only when complete."""
    journal.check_id(entry_id)
    with lock.hold(host.state_dir, "tune rollback"):
        entry = journal.find(host.state_dir, entry_id)
        journal.refuse_live(entry, "rollback")
        if entry["state"] not in journal.OPEN_STATES:
            raise ProxytuneError(f"journal entry {entry['id']} is {entry['state']}: nothing left to undo")
        check_entry(entry, host)
        with _interrupts_ignored():
            result = undo_steps(reached(entry), entry["os"], host, force, unsure=_in_progress(entry))
            notes = result.notes + after_files(entry["steps"], entry["os"], host)
            entry["state"] = journal.ROLLED_BACK if result.complete else journal.ROLLBACK_FAILED
            journal.save(host.state_dir, entry)
    return Outcome(entry=entry, steps=reached(entry), notes=notes, failures=result.failures, kept=result.kept)


def reached(entry: dict) -> list[dict]:
    """The steps an apply started: those done and the one in progress when it stopped. The
    rest never ran, so whatever they hold now is not ours to undo."""
    return entry["steps"][:entry["done"] + 1]


def _in_progress(entry: dict) -> dict | None:
    """The step an apply stopped in, if any: it may or may not have written."""
    return entry["steps"][entry["done"]] if entry["done"] < len(entry["steps"]) else None


def _do(step: dict, os_name: str, host: Host) -> None:
    if step["kind"] == "runtime":
        be = backends.get(os_name, step["backend"], host)
        be.write(step["key"], parse(step["new"]))
        step["wrote"] = be.snapshot(step["key"])
        return
    path, old, wrote = Path(step["path"]), step["old"], step["wrote"]
    now = files.read_for_edit(path, host.root)
    if (now and now.sha256) != (old and old["sha256"]):
        raise ProxytuneError(f"{path} changed while this apply ran; left as it is")
    like = FileState("", wrote["mode"], wrote["uid"], wrote["gid"], wrote["sha256"])
    step["created_dirs"] = files.write(path, step["new"], like=like, root=host.root)


@contextmanager
def _interrupts_raise():
    """SIGTERM behaves like Ctrl-C while steps run, so that both undo what was done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _interrupts_ignored():
    """No Ctrl-C/SIGTERM in the middle of an undo: it must finish and be recorded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def describe(step, undo: bool = False) -> str:
    """One line for a step: what changes, from what, to what (reversed for undo)."""
    if step["kind"] == "file":
        if undo:
            return f"{'remove' if step['old'] is None else 'restore'} {step['path']}"
        return f"{'create' if step['old'] is None else 'rewrite'} {step['path']}"
    old = step["old"]
    if isinstance(old, dict):
        old_text = ", ".join(f"{k}={_show_old(v)}" for k, v in old.items())
    else:
        old_text = " ".join(str(old).split())
    new_text = render(parse(step["new"]))
    return f"{step['address']}: {new_text} -> {old_text}" if undo else f"{step['address']}: {old_text} -> {new_text}"


def _show_old(v) -> str:
    if isinstance(v, dict) and "limits" in v:       # rlimit: one process
        return render(tuple(v["limits"]))
    return render(tuple(v)) if isinstance(v, list) else str(v)


class InjectedBug(RuntimeError):
    """The fault `bug` injects: stands for any unexpected exception."""


def _fault_point(n: int) -> None:
    if not (PACKAGE_ROOT / "tests" / "conftest.py").is_file():
        return          # not the test suite's checkout: an installed proxytune has no faults to inject
    spec = os.environ.get(FAULT_ENV, "")
    at, _, how = spec.partition(":")
    if at != str(n):
        return
    if how == "bug":
        raise InjectedBug(f"injected fault after step {n}")
    sig = {"": signal.SIGKILL, "kill": signal.SIGKILL, "stop": signal.SIGSTOP,
           "int": signal.SIGINT, "term": signal.SIGTERM}[how]
    os.kill(os.getpid(), sig)

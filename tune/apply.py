"""Execute a plan step by step, journaled; undo on failure or Ctrl-C; roll back later.

A step is either a runtime write through a backend or a whole-file write
(through tune/files.py). Both record the old state in the journal before the
first step runs, and what they wrote (a runtime value read back after
writing, a file's sha256, mode and owner) so that rollback can tell ours
from a later change. apply and rollback hold the host's lock and the state
dir's (tune/lock.py). The journal says a step's write is issued before it is,
and that it returned after: only such steps are ever undone. SIGTERM and
SIGHUP (an ssh drop) stop an apply like Ctrl-C: what was written is undone;
under nohup (SIGHUP ignored at start) a hangup stops nothing (core/signals.py).
Each apply and rollback leaves one line in the journal or syslog (eventlog).
"""

import json
import os
import signal
import threading
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import backends, eventlog, files, journal, lock
from proxytune.core.errors import Interrupted, NotApplicable, ProxytuneError
from proxytune.core import signals
from proxytune.core.invocation import command, needs_root
from .files import FileState
from .host import Host
from .model import Plan
from .undo import after_files, check_entry, label, undo_steps
from .values import as_json, parse, render

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


def refuse_unprivileged(steps: list[dict]) -> None:
    """Not root, and a step changes a live setting or writes where we may not: say it needs root
    before the journal is written, not as a permission error half-way through."""
    if os.geteuid() == 0:
        return
    for step in steps:
        if step["kind"] == "runtime" and step["backend"] != "rlimit":   # prlimit of one's own process may pass
            raise needs_root(f"it changes {step['address']} live")
        if step["kind"] == "file" and not os.access(_existing_parent(Path(step["path"])), os.W_OK):
            raise needs_root(f"it writes {step['path']}")


def _existing_parent(path: Path) -> Path:
    """The nearest directory above `path` that exists: where a new file or directory would go."""
    for parent in path.parents:
        if parent.is_dir():
            return parent
    return Path("/")


def _is_runtime(plan: Plan, change) -> bool:
    return backends.REGISTRY[(plan.os, change.setting.backend)].runtime


def apply_plan(plan: Plan, host: Host, persist: bool = False, files_only: bool = False,
               confirmed: list[dict] | None = None) -> Outcome:
    """Run the plan's steps. `confirmed`: the steps the user was shown and agreed to; the steps are
    planned again under the lock and must be the same ones, from the same old state, or nothing runs."""
    with eventlog.recorded("apply", host, plan.profile) as rec, lock.hold(host, "tune apply"):
        _refuse_open_apply(host)
        steps, notes = steps_for(plan, host, persist, files_only)
        refuse_unprivileged(steps)
        if confirmed is not None:
            refuse_unconfirmed(steps, confirmed)
        if not steps:
            return Outcome(entry=None, notes=notes + ["nothing to change: every selected setting is met"])
        rec["entry"] = entry = journal.new_entry(host.state_dir, plan.profile, plan.os, host.root, steps)
        rec["steps"] = len(steps)
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
                         f"look at it, then run {command('tune apply')} again to see the new plan")


def _refuse_open_apply(host: Host) -> None:
    for e in journal.open_entries(host.state_dir):
        if e["state"] == journal.APPLYING:
            journal.refuse_live(e, "apply")
            raise ProxytuneError(f"apply {e['id']} was interrupted (its pid {e['owner']['pid']} is gone) "
                                 "and may be half done", f"run {command('tune rollback')} first; nothing was changed")


def _run(entry: dict, os_name: str, host: Host) -> list[str]:
    """Every step, the journal saved before each write is issued and after it returned; on any
    failure or interrupt undo what was written."""
    steps = entry["steps"]
    try:
        after_step(0)
        for i, step in enumerate(steps, 1):
            _do(step, os_name, host, issuing=lambda: _save(entry, host, writing=i))
            entry["done"] = i
            _save(entry, host, writing=None)
            after_step(i)
        notes = after_files(steps, os_name, host)
        entry["state"] = journal.APPLIED
        journal.save(host.state_dir, entry)
        return notes
    except BaseException as e:
        _abandon(entry, reached(entry), os_name, host, e)


def _save(entry: dict, host: Host, writing: int | None) -> None:
    """Record that step `writing` is about to write (None: no write in flight). Until that is
    saved the step does not count as issued, in the journal or here."""
    entry.pop("writing", None)
    try:
        if writing is not None:
            entry["writing"] = writing
        journal.save(host.state_dir, entry)
    except BaseException:
        entry.pop("writing", None)
        raise


def _abandon(entry: dict, steps: list[dict], os_name: str, host: Host, cause: BaseException):
    """Undo the steps written (not itself interruptible), record it, raise one clear error."""
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
    hint = "nothing stays changed" if not problems else f"fix the cause, then {command('tune rollback --force')}"
    at = label(entry["steps"][min(entry["done"], len(entry["steps"]) - 1)])
    where = f" at {at}" if at not in reason else ""
    if isinstance(cause, KeyboardInterrupt):
        raise Interrupted(f"{reason}{where}; {undone} ({recorded})", hint) from None
    if isinstance(cause, (ProxytuneError, NotApplicable, OSError)):
        raise ProxytuneError(f"apply failed{where}: {reason}; {undone} ({recorded})", hint) from cause
    if isinstance(cause, Exception):
        cause.add_note(f"apply stopped{where}; {undone} ({recorded})")
    raise cause


def _reason(e: BaseException) -> str:
    if isinstance(e, KeyboardInterrupt):
        return " ".join(["interrupted", *map(str, e.args[:1])])
    return getattr(e, "message", None) or getattr(e, "strerror", None) or str(e) or type(e).__name__


def rollback(host: Host, entry_id: str | None = None, force: bool = False) -> Outcome:
    """Undo an entry's steps that are still ours (all with force); 'rolled-back' only when complete."""
    journal.check_id(entry_id)
    with eventlog.recorded("rollback", host) as rec, lock.hold(host, "tune rollback"):
        entry = journal.find(host.state_dir, entry_id)
        rec.update(profile=entry["profile"], steps=len(reached(entry)))
        journal.refuse_live(entry, "rollback")
        if entry["state"] not in journal.OPEN_STATES:
            raise ProxytuneError(f"journal entry {entry['id']} is {entry['state']}: nothing left to undo")
        check_entry(entry, host)
        with _interrupts_ignored():
            result = undo_steps(reached(entry), entry["os"], host, force)
            notes = result.notes + after_files(entry["steps"], entry["os"], host)
            was, entry["state"] = entry["state"], journal.ROLLED_BACK if result.complete else journal.ROLLBACK_FAILED
            rec["entry"] = entry
            try:
                journal.save(host.state_dir, entry)
            except ProxytuneError as e:      # undone all the same: say that first, then what is missing
                _unsaved(entry, was, result, e)
    return Outcome(entry=entry, steps=reached(entry), notes=notes, failures=result.failures, kept=result.kept)


def _unsaved(entry: dict, was: str, result, e: ProxytuneError):
    """One line: what the rollback did, and that the journal still says what it said before."""
    done = (f"rolled back {len(reached(entry))} step(s)" if result.complete else
            f"rollback incomplete ({'; '.join(result.failures + result.kept)})")
    raise ProxytuneError(f"{done}, but the journal could not be saved ({e.message}); "
                         f"entry {entry['id']} still says {was}",
                         "make room in the state directory's filesystem (or make it writable), then run "
                         "`proxytune tune rollback` again to record it") from None


def reached(entry: dict) -> list[dict]:
    """The steps an apply wrote: those whose write returned, and the one whose write was
    issued when it stopped (it may have written). A step stopped before its write, and
    the steps after it, never ran: whatever they hold now is not ours to undo."""
    done = entry["done"]
    return entry["steps"][:done + 1] if entry.get("writing") == done + 1 else entry["steps"][:done]


def _do(step: dict, os_name: str, host: Host, issuing) -> None:
    """One step's write; `issuing()` records it in the journal once nothing stands in its way."""
    if step["kind"] == "runtime":
        be = backends.get(os_name, step["backend"], host)
        value = parse(step["new"])
        issuing()
        be.write(step["key"], value)
        step["wrote"] = be.snapshot(step["key"])
        return
    path, old, wrote = Path(step["path"]), step["old"], step["wrote"]
    now = files.read_for_edit(path, host.root)
    if (now and now.sha256) != (old and old["sha256"]):
        raise ProxytuneError(f"{path} changed while this apply ran; left as it is")
    like = FileState("", wrote["mode"], wrote["uid"], wrote["gid"], wrote["sha256"])
    issuing()
    step["created_dirs"] = files.write(path, step["new"], like=like, root=host.root)


STOPS = (signal.SIGTERM, signal.SIGHUP)     # a kill, an ssh session or terminal gone: like Ctrl-C


def _stop(signum, frame):
    raise KeyboardInterrupt(f"by {signal.Signals(signum).name}")


@contextmanager
def _interrupts_raise():
    """SIGTERM and SIGHUP behave like Ctrl-C while steps run, so that all undo what was done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = signals.catch(STOPS, _stop)          # nohup's ignored SIGHUP stays ignored
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


@contextmanager
def _interrupts_ignored():
    """No Ctrl-C, SIGTERM or SIGHUP in the middle of an undo: it must finish and be recorded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, *STOPS)}
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


def after_step(n: int) -> None:
    """Called once step n is done and journaled (0: the journal first written). Nothing here:
    the crash-safety tests put a kill, stop or exception in this seam (tests/faulty_cli.py)."""

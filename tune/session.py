"""One `tune plan`, `tune apply` or `tune rollback` from the request to the verify: what the
commands (and each fleet host, which runs them) do between parsing options and printing.

The order is the operator's guarantee: everything that can refuse (a setting in error, a
blocked change, a step this user may not make) refuses before the first question is asked,
and so before anything changes; after an apply, the host is read again (the verify).
"""

from dataclasses import dataclass

from . import apply as apply_mod, journal, plan as plan_mod
from .host import Host
from .model import Plan


@dataclass(frozen=True)
class Request:
    """What a tune command was asked: the profile, its parameters (--service, --user, --cache-dir),
    the selection (--only, --skip), and how far apply goes (--persist, --files-only)."""
    profile: str
    params: dict
    only: tuple = ()
    skip: tuple = ()
    persist: bool = False
    files_only: bool = False

    def plan(self, host: Host) -> Plan:
        return plan_mod.build(self.profile, host, self.params, self.only, self.skip)


def scope_notes(host: Host, files_only: bool) -> list[str]:
    """What --root and --files-only mean for this run, said where the plan is shown."""
    notes = []
    if not host.live:
        notes.append(f"--root {host.root}: files are read and written under {host.root}; live settings "
                     "(sysctls, mounts, process limits) are those of the namespace this runs in")
    if files_only:
        notes.append("--files-only: only files are written; no live setting is changed")
    return notes


def preview(req: Request, host: Host) -> tuple[Plan, list[dict], list[str]]:
    """`tune plan`: the plan, the steps apply would run, and the notes on them. Changes nothing."""
    plan = req.plan(host)
    steps, notes = apply_mod.steps_for(plan, host, req.persist, req.files_only)
    return plan, steps, scope_notes(host, req.files_only) + notes + plan_mod.boot_warnings(plan, req.persist)


def prepare_apply(req: Request, host: Host, warn) -> tuple[Plan, list[dict]]:
    """The plan and the steps apply will run, refused (nothing changed) when a setting is in
    error, a change is blocked, or a step needs a privilege this user lacks. warn(line) gets what
    apply cannot make stick over a reboot, before the steps are worked out."""
    plan = req.plan(host)
    plan_mod.refuse_errors(plan)
    apply_mod.refuse_blocked(plan, req.files_only)
    for warning in plan_mod.boot_warnings(plan, req.persist):
        warn(warning)
    steps, _ = apply_mod.steps_for(plan, host, req.persist, req.files_only)
    apply_mod.refuse_unprivileged(steps)
    return plan, steps


def apply_and_verify(req: Request, host: Host, plan: Plan, confirmed: list[dict] | None):
    """(the outcome, the plan read again afterwards). confirmed: the steps the operator was shown
    (None with --yes); apply refuses when the host changed since."""
    outcome = apply_mod.apply_plan(plan, host, req.persist, req.files_only, confirmed=confirmed)
    outcome.notes[:0] = scope_notes(host, req.files_only)
    return outcome, req.plan(host)


def rollback_target(host: Host, entry_id: str | None) -> tuple[dict, list[dict]]:
    """(the journal entry rollback undoes, its steps not undone yet), refused when a step needs a
    privilege this user lacks."""
    journal.check_id(entry_id)
    entry = journal.find(host.state_dir, entry_id)
    pending = [s for s in entry["steps"] if not s.get("undone")]
    apply_mod.refuse_unprivileged(pending)
    return entry, pending


def rollback_exit_code(outcome: apply_mod.Outcome) -> int:
    """2 when a step failed, 1 when a value or file changed since the apply was kept, else 0."""
    return 2 if outcome.failures else 1 if outcome.kept else 0


def history(host: Host) -> list[dict]:
    """The journal, oldest first: id, state (an apply whose process is gone shows as interrupted),
    profile, steps and steps done."""
    return [{"id": e["id"], "seq": e["seq"], "state": journal.status(e), "profile": e["profile"],
             "steps": len(e["steps"]), "done": e["done"]} for e in journal.entries(host.state_dir)]

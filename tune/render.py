"""Terminal rendering of plans, audits and apply/rollback outcomes (rich).

The same data goes to --json untouched; this module only decides how a
person sees it. Tables are boxed on a terminal and plain tab-separated rows
otherwise (or as --format says), so awk and cut can read piped output.
"""

from rich.markup import escape

from proxytune.core.console import console, rich_table

from .apply import Outcome, describe
from .audit import settings_table, summary_line
from .model import Plan
from .modes import describe as describe_mode
from .profile import Profile


def print_plan(plan: Plan, title: str, show_target: bool = False) -> None:
    """The plan's settings (the audit's table, with what apply will set), its parameters, notes and counts."""
    doc = plan.to_json()
    out = console()
    out.print(rich_table(settings_table(doc, title, show_target)))
    print_parameters(plan)
    for n in plan.notes:
        out.print(f"[dim]note: {escape(n)}[/]")
    out.print(summary_line(doc))


def print_parameters(plan: Plan) -> None:
    vals, srcs = plan.params["values"], plan.params["sources"]
    console().print("[dim]parameters: " + escape("; ".join(
        f"{k}={','.join(v) if isinstance(v, list) else v or '-'} ({srcs[k]})" for k, v in vals.items())) + "[/]")


def print_steps(steps: list[dict], verb: str, undo: bool = False) -> None:
    out = console()
    for s in (reversed(steps) if undo else steps):
        out.print(f"  {verb} {escape(describe(s, undo))}")


def print_outcome(outcome: Outcome, verb: str) -> None:
    out = console()
    if outcome.entry is None:
        for n in outcome.notes:
            out.print(n)
        return
    out.print(f"{verb} {len(outcome.steps)} step(s); journal {outcome.entry['id']} ({outcome.entry['state']})")
    print_steps(outcome.steps, "-", undo=verb.startswith("rolled"))
    for n in outcome.notes:
        out.print(f"[dim]note: {n}[/]")
    for k in outcome.kept:
        out.print(f"[yellow]{escape(k)}[/]")
    for f in outcome.failures:
        out.print(f"[red]failed: {escape(f)}[/]")


def profile_text(name: str, p: Profile) -> str:
    """`profiles show`: the profile, then each setting with its mode and value, reason and source."""
    lines = [f"{name} ({p.os}): {p.description}\nfile: {p.path}"]
    lines += [f"  {r.backend}:{r.key}  {describe_mode(r.mode, r.wanted)}\n      {r.reason}  [{r.source}]" for r in p.raw]
    return "\n".join(lines)

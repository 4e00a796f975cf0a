"""Terminal rendering of plans, audits and apply/rollback outcomes (rich).

The same data goes to --json untouched; this module only decides how a
person sees it. Tables are boxed on a terminal and plain tab-separated rows
otherwise (or as --format says), so awk and cut can read piped output.
"""

from rich.markup import escape
from rich.table import Table

from proxytune.core.console import console

from .apply import Outcome, describe
from .model import DRIFT, ERROR, MET, NOT_APPLICABLE, Plan
from .values import render

STYLE = {MET: "green", DRIFT: "yellow", NOT_APPLICABLE: "dim", ERROR: "red", "ok": "green", "warn": "yellow"}


def plan_table(plan: Plan, title: str, show_target: bool = False) -> Table:
    t = Table(title=title, title_justify="left", show_lines=False, expand=False)
    t.add_column("setting", overflow="fold")
    t.add_column("current")
    t.add_column("wanted")
    if show_target:
        t.add_column("will set")
    t.add_column("status")
    t.add_column("reason / note", overflow="fold", max_width=60)
    for c in plan.changes:
        row = [escape(c.setting.address), escape(c.current_text()), escape(c.setting.wanted_text)]
        if show_target:
            row.append(render(c.target) if c.needed else "")
        status = f"[{STYLE[c.status]}]{c.status}[/]"
        note = escape(c.notes or c.setting.reason)
        if c.status == DRIFT and c.notes:
            note = f"[red]{note}[/]"
        row += [status, note]
        t.add_row(*row)
    return t


def print_plan(plan: Plan, title: str, show_target: bool = False) -> None:
    out = console()
    out.print(plan_table(plan, title, show_target))
    vals, srcs = plan.params["values"], plan.params["sources"]
    out.print("[dim]parameters: " + "; ".join(
        f"{k}={','.join(v) if isinstance(v, list) else v or '-'} ({srcs[k]})" for k, v in vals.items()) + "[/]")
    for n in plan.notes:
        out.print(f"[dim]note: {escape(n)}[/]")
    s = {st: plan.count(st) for st in (MET, DRIFT, NOT_APPLICABLE, ERROR)}
    out.print(f"{s[MET]} met, {s[DRIFT]} drift, {s[NOT_APPLICABLE]} not applicable, {s[ERROR]} error")


def _status_table(title: str, headers: list[str], rows: list[list], status_col: int) -> Table:
    t = Table(title=title, title_justify="left")
    for col in headers:
        t.add_column(col)
    for r in rows:
        cells = [escape(str(c)) for c in r]
        cells[status_col] = f"[{STYLE[r[status_col]]}]{r[status_col]}[/]"
        t.add_row(*cells)
    return t


def print_observations(obs: dict) -> None:
    out = console()
    if not obs["running"]:
        out.print(f"[dim]no running {obs['service']} process to inspect[/]")
    if obs["processes"]:
        out.print(_status_table(f"running {obs['service']} processes",
                                ["pid", "nofile soft", "nofile hard", "fds open", "status", "note"],
                                [[p["pid"], p["nofile_soft"], p["nofile_hard"], p["fds_open"], p["status"], p["note"]]
                                 for p in obs["processes"]], 4))
    if obs["listeners"]:
        out.print(_status_table("listen sockets (ss -ltn)", ["address", "queued", "backlog", "status", "note"],
                                [[s["local"], s["queued"], s["backlog"], s["status"], s["note"]]
                                 for s in obs["listeners"]], 3))
    if obs["cache_dirs"]:
        out.print(_status_table("cache directories", ["path", "mount", "atime", "status", "note"],
                                [[d["path"], d.get("mountpoint", "-"), d.get("atime", "-"), d["status"], d["note"]]
                                 for d in obs["cache_dirs"]], 3))


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

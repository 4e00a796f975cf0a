"""What is applied on this host now (like `tuned-adm active`), and what drifted since.

Read from the apply journal: every entry still open (applied, interrupted, or a
rollback left incomplete) with its profile, when and by whom, its steps, and
for each step written whether the host still holds what apply wrote — the
same comparison rollback makes before it undoes a step (a runtime value read
back by its backend, a file's sha256). Changes nothing.
"""

from pathlib import Path

from . import backends, files, journal
from proxytune.core.errors import NotApplicable, ProxytuneError, one_line
from .apply import reached
from .backends.base import show
from .host import Host
from .undo import label


def applied(host: Host) -> list[dict]:
    """One dict per open journal entry, oldest first, with its drift since the apply."""
    out = []
    for e in journal.open_entries(host.state_dir):
        steps = [s for s in reached(e) if not s.get("undone")]
        out.append({"journal": e["id"], "state": journal.status(e), "profile": e["profile"],
                    "applied": e["created"], "by": e.get("by") or {}, "root": e["root"], "steps": len(steps),
                    "drift": [d for s in steps if (d := drift(s, e["os"], host))]})
    return out


def drift(step: dict, os_name: str, host: Host) -> str | None:
    """None while the host holds what this step wrote; else one line saying what it holds now."""
    try:
        if step["kind"] == "file":
            now = files.read_for_edit(Path(step["path"]), host.root)
            if (now and now.sha256) == step["wrote"]["sha256"]:
                return None
            return f"{label(step)}: {'removed' if now is None else 'edited (sha256 ' + now.sha256[:12] + ')'}"
        now = backends.get(os_name, step["backend"], host).snapshot(step["key"])
    except NotApplicable:
        return f"{label(step)}: no longer present here"
    except ProxytuneError as e:
        return f"{label(step)}: cannot be read ({e.message})"
    if "wrote" not in step or now == step["wrote"]:
        return None if "wrote" in step else f"{label(step)}: the apply stopped while writing it (now {show(now)})"
    return f"{label(step)}: now {show(now)}, applied {show(step['wrote'])}"


def exit_code(entries: list[dict]) -> int:
    """0 when what is applied still holds; 1 on drift, an interrupted apply or an incomplete rollback."""
    return 1 if any(e["drift"] or e["state"] != journal.APPLIED for e in entries) else 0


def who(by: dict) -> str:
    """'root', 'root (sudo alice)' or 'unknown' for entries written before `by` was recorded."""
    if not by:
        return "unknown"
    user = by.get("user") or f"uid {by.get('uid')}"
    return f"{user} (sudo {by['sudo_user']})" if by.get("sudo_user") else user


def lines(host: Host, entries: list[dict]) -> list[str]:
    """What `status` prints: one line per open entry and one per step that drifted, each one line
    (a profile path or a journal's text may carry controls)."""
    if not entries:
        return [f"nothing applied (journal {journal.directory(host.state_dir)})"]
    out = []
    for e in entries:
        since = f"{len(e['drift'])} drifted since" if e["drift"] else "no drift since"
        out.append(one_line(f"{e['profile']}: {e['state']} {e['applied']} by {who(e['by'])}, "
                            f"{e['steps']} step(s), journal {e['journal']}: {since}"))
        out += [one_line(f"  drift: {d}") for d in e["drift"]]
    return out

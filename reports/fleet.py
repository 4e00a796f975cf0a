"""A fleet result as a hosts x settings matrix: one column per host, one
row per setting (the union over hosts), each cell the host's current value
and its status; then the hosts that could not be audited and why."""

from pathlib import Path

from proxytune.core.errors import ProxytuneError, one_line
from proxytune.core.sections import Table

from .build import load_results

MARK = {"met": "met", "drift": "DRIFT", "n/a": "n/a", "error": "ERROR"}


def load(path: Path) -> dict:
    """A `fleet ... --json` result file, checked like any result; any other kind is refused."""
    doc = load_results([path])[0]
    if doc["kind"] != "fleet":
        raise ProxytuneError(f"{path} is a {doc['kind']} result, not a fleet result")
    return doc


def matrix(data: dict) -> Table:
    names = list(data["hosts"])
    rows_by_setting: dict[str, dict] = {}
    for name in names:
        for row in data["hosts"][name].get("settings", []):
            rows_by_setting.setdefault(row["setting"], {"wanted": row["wanted_text"]})[name] = row
    head = [["host status", ""] + [data["hosts"][n]["status"] for n in names],
            ["kernel", ""] + [(data["hosts"][n].get("fingerprint") or {}).get("kernel", "-") for n in names]]
    for key, label in (("journal", "journal entry"), ("steps", "steps"), ("rolled_back", "rolled back")):
        if any(key in data["hosts"][n] for n in names):
            head.append([label, ""] + [_cell(data["hosts"][n].get(key)) for n in names])
    caps = []
    for name in names:
        caps += [c for c in data["hosts"][name].get("capabilities", {}) if c not in caps]
    body = [[f"can: {c}", ""] + [_yes_no(data["hosts"][n].get("capabilities", {}).get(c)) for n in names]
            for c in caps]
    for setting, per in rows_by_setting.items():
        cells = [f"{per[n]['current_text']} ({MARK.get(per[n]['status'], per[n]['status'])})" if n in per else "-"
                 for n in names]
        body.append([setting, per["wanted"], *cells])
    return _shown(Table(f"Fleet {data['fleet']}: profile {data['profile']}", ["setting", "wanted", *names], head + body))


def _shown(t: Table) -> Table:
    """Every cell comes from hosts or a result file: no control character reaches a terminal,
    a Markdown row or an HTML page (each medium then escapes its own syntax)."""
    return Table(one_line(t.title), [one_line(h) for h in t.headers],
                 [[one_line(c) for c in row] for row in t.rows], status_col=t.status_col)


def _cell(value) -> str:
    return "-" if value is None else _yes_no(value) if isinstance(value, bool) else str(value)


def _yes_no(flag) -> str:
    return "-" if flag is None else ("yes" if flag else "no")


def problems(data: dict) -> Table | None:
    rows = [[n, h["status"], h.get("error") or ""] for n, h in data["hosts"].items() if h["status"] != "ok"]
    return _shown(Table("Hosts not fully handled", ["host", "status", "why"], rows, status_col=1)) if rows else None


def tables(data: dict) -> list[Table]:
    return [t for t in (matrix(data), problems(data)) if t]


def summary_line(data: dict) -> str:
    s = data["summary"]
    drift = sum(1 for h in data["hosts"].values() if h.get("summary", {}).get("drift"))
    line = (f"{len(data['hosts'])} host(s): {s['ok']} ok, {s['unreachable']} unreachable, {s['failed']} failed"
            f"{', ' + str(s['skipped']) + ' not reached' if s['skipped'] else ''}; {drift} with drift")
    return line + (f"; {data['stopped']}" if data.get("stopped") else "")


def write(doc: dict, out_dir: Path) -> list[Path]:
    from .build import write_files
    from .html import CSS, html_text, table as html_table
    from .markdown import md_text, table as md_table
    data = doc["data"]
    md = (f"# proxytune fleet {md_text(data['fleet'])}\n\n{md_text(summary_line(data))}\n\n"
          + "\n".join(md_table(t, "##") for t in tables(data)))
    html = ("<!doctype html><html lang=en><head><meta charset=utf-8><title>proxytune fleet</title>"
            f"<style>{CSS}</style></head><body>\n<h1>proxytune fleet {html_text(data['fleet'])}</h1>"
            f"<p class=sub>{html_text(summary_line(data))}</p>\n"
            + "\n".join(html_table(t, "h2") for t in tables(data)) + "\n</body></html>\n")
    return write_files(out_dir, {"fleet.md": md, "fleet.html": html})


def print_terminal(data: dict) -> None:
    """The matrix and the problem hosts as rich tables, then one summary line."""
    from proxytune.core.console import console, rich_table, term_text
    out = console()
    for t in tables(data):
        out.print(rich_table(t, _styled))
    out.print(term_text(summary_line(data)))


def _styled(cell: str) -> str:
    from proxytune.core.console import term_text
    for word, style in (("(DRIFT)", "yellow"), ("(ERROR)", "red"), ("unreachable", "red"), ("failed", "red")):
        if word in cell:
            return f"[{style}]{term_text(cell)}[/]"
    return term_text(cell)

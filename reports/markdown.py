"""Result JSON -> Markdown (for pull requests, tickets, docs); figures are PNG files beside it."""

from proxytune.core.errors import one_line
from proxytune.core.sections import Section, Table

from .tables import host_table, sections


def _text(v) -> str:
    """A string from a result as Markdown text: one line, no raw HTML (hostnames and saved
    results are input, and a newline or a tag would end a table row or run in a viewer)."""
    return one_line(v).replace("&", "&amp;").replace("<", "&lt;")


def _cell(v) -> str:
    if isinstance(v, list):
        v = " ".join(str(x) for x in v)
    return _text("-" if v is None else v).replace("|", "\\|")


def table(t: Table, level: str = "###") -> str:
    out = [f"{level} {_text(t.title)}\n", "| " + " | ".join(_cell(h) for h in t.headers) + " |",
           "|" + "---|" * len(t.headers)]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in t.rows]
    return "\n".join(out) + "\n"


def section(s: Section) -> str:
    out = [f"## {_text(s.title)}\n"]
    if s.intro:
        out.append(_text(s.intro) + "\n")
    out += [table(t) for t in s.tables]
    out += [f"![{_text(f.caption)}]({f.name})\n" for f in s.drawn_figures()]
    out += [f"- {_text(n)}" for n in s.notes]
    return "\n".join(out) + "\n"


def render(doc: dict) -> str:
    d = doc["data"]
    out = [f"# {d['title']}\n", f"Created {doc['created']}.\n", table(host_table(doc["host"]), "##")]
    out += [section(s) for s in sections(doc)]
    return "\n".join(out)

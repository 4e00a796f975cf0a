"""Result JSON -> Markdown (for pull requests, tickets, docs); figures are PNG files beside it."""

import re

from proxytune.core.errors import one_line
from proxytune.core.sections import Section, Table

from .tables import host_table, sections


# what makes Markdown of text: links and images ([ ] !), code spans, emphasis (*), table cells (|), and
# the escape itself; '_' is left (GFM takes none inside a word, and setting names are full of it)
MD_PUNCTUATION = re.compile(r"([\\`*\[\]!|])")


def md_text(v) -> str:
    """THE way text reaches Markdown: one line; no raw HTML, entity or autolink (& and < as entities;
    a '>' alone opens nothing, and '>= 8192' stays readable);
    no link, image, code span or table cell break (their punctuation backslash-escaped).
    Hostnames, file names and saved results are input; a viewer must show them as written."""
    text = one_line(v).replace("&", "&amp;").replace("<", "&lt;")
    return MD_PUNCTUATION.sub(r"\\\1", text)


def _cell(v) -> str:
    if isinstance(v, list):
        v = " ".join(str(x) for x in v)
    return md_text("-" if v is None else v)


def table(t: Table, level: str = "###") -> str:
    out = [f"{level} {md_text(t.title)}\n", "| " + " | ".join(_cell(h) for h in t.headers) + " |",
           "|" + "---|" * len(t.headers)]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in t.rows]
    return "\n".join(out) + "\n"


def section(s: Section) -> str:
    out = [f"## {md_text(s.title)}\n"]
    if s.intro:
        out.append(md_text(s.intro) + "\n")
    out += [table(t) for t in s.tables]
    out += [f"![{md_text(f.caption)}]({f.name})\n" for f in s.drawn_figures()]
    out += [f"- {md_text(n)}" for n in s.notes]
    return "\n".join(out) + "\n"


def render(doc: dict, secs: list | None = None) -> str:
    d = doc["data"]
    out = [f"# {md_text(d['title'])}\n", f"Created {md_text(doc['created'])}.\n", table(host_table(doc["host"]), "##")]
    out += [section(s) for s in (sections(doc) if secs is None else secs)]
    return "\n".join(out)

"""Result JSON -> one self-contained HTML page: inline CSS, figures embedded
as data: URIs, no scripts, nothing fetched from a network."""

import base64
import html as h

from proxytune.core.errors import one_line
from proxytune.core.sections import Section, Table

from .tables import host_table, sections

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.6em 0 1.4em;display:block;overflow-x:auto;max-width:100%}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.met,.ok{color:#17802c}.drift,.warn{color:#a66300;font-weight:600}.error{color:#b00020;font-weight:600}
.na{color:#888}.holds{color:#17802c}.grew{color:#1b5fa8;font-weight:600}.shrank{color:#a66300}.reversed{color:#b00020;font-weight:600}.inconclusive{color:#666;font-style:italic}code{background:#f5f5f5;padding:0 3px}h1{margin-bottom:0}.sub{color:#666}
@media (max-width:700px){body{margin:1em .5em;font-size:13px}td,th{padding:2px 4px}
table.cards,.cards tbody,.cards tr,.cards td{display:block}.cards tr:first-child{display:none}
.cards tr{border:1px solid #ccc;margin:0 0 .6em}.cards td{border:0;border-top:1px solid #eee}
.cards td::before{content:attr(data-label) ": ";font-weight:600;color:#444}}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #ddd}figcaption{color:#555}
"""


def html_text(v) -> str:
    """THE way text reaches HTML: one line (control characters as escapes: the page may be read
    with cat), then escaped (quotes too: it also fills attributes)."""
    if isinstance(v, list):
        v = " ".join(str(x) for x in v)
    return h.escape(one_line("-" if v is None else v))


def table(t: Table, level: str = "h3") -> str:
    """Wide tables scroll inside their box; on a phone every row becomes a card of label: value lines."""
    cards = " class=cards" if len(t.headers) > 2 else ""
    out = [f"<{level}>{html_text(t.title)}</{level}>",
           f"<table{cards}><tr>" + "".join(f"<th>{html_text(x)}</th>" for x in t.headers) + "</tr>"]
    for r in t.rows:
        cells = []
        for i, c in enumerate(r):
            cls = {"n/a": "na", "not measurable here": "na", "inconclusive here": "inconclusive"}.get(c, c) if i == t.status_col else ""
            label = f' data-label="{html_text(t.headers[i])}"' if cards and i < len(t.headers) else ""
            klass = f' class="{html_text(cls)}"' if cls else ""
            cells.append(f"<td{label}{klass}>{html_text(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


def section(s: Section) -> str:
    out = [f"<section><h2>{html_text(s.title)}</h2>"]
    if s.intro:
        out.append(f"<p>{html_text(s.intro)}</p>")
    out += [table(t) for t in s.tables]
    for f in s.drawn_figures():
        data = base64.b64encode(f.png).decode()
        out.append(f'<figure><img alt="{html_text(f.caption)}" src="data:image/png;base64,{data}">'
                   f"<figcaption>{html_text(f.caption)}</figcaption></figure>")
    out += [f"<p class=sub>{html_text(n)}</p>" for n in s.notes]
    return "\n".join(out) + "</section>"


def render(doc: dict, secs: list | None = None) -> str:
    d = doc["data"]
    body = [f"<h1>{html_text(d['title'])}</h1>", f"<p class=sub>created {html_text(doc['created'])}</p>",
            table(host_table(doc["host"]), "h2")] + [section(s) for s in (sections(doc) if secs is None else secs)]
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport content='width=device-width,initial-scale=1'><title>proxytune report</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")

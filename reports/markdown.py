"""Result JSON -> Markdown (for pull requests, tickets, docs)."""

from .tables import Table, audit_notes, audit_summary, audit_tables, host_table


def _cell(v) -> str:
    if isinstance(v, list):
        v = " ".join(str(x) for x in v)
    return str("-" if v is None else v).replace("|", "\\|")


def table(t: Table, level: str = "###") -> str:
    out = [f"{level} {t.title}\n", "| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers)]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in t.rows]
    return "\n".join(out) + "\n"


def render(doc: dict) -> str:
    d = doc["data"]
    out = [f"# {d['title']}\n", f"Created {doc['created']}.\n", table(host_table(doc["host"]), "##")]
    if "audit" in d["sections"]:
        a = d["sections"]["audit"]
        tables = audit_tables(a)
        out += [table(tables[0], "##"), audit_summary(a) + "\n"]
        out += [f"- note: {n}" for n in audit_notes(a)] + [""]
        out += [table(t) for t in tables[1:]]
    return "\n".join(out)

"""`report compare A.json B.json ...`: results from several hosts (or one
host before and after tuning) side by side, one column per file. Each file
may be a report, a single bench, an audit or a doctor result; a section
appears when at least one file has it, with '-' where a file has not."""

from pathlib import Path

from proxytune.core.sections import RENDER_ERRORS, Table, unrenderable


def sections_of(doc: dict) -> dict:
    """kind -> data for one result file."""
    if doc["kind"] == "report":
        return dict(doc["data"]["sections"])
    if doc["kind"] == "bench":
        return {doc["data"]["bench"]: doc["data"]}
    if doc["kind"] == "audit":
        return {"audit": doc["data"]}
    if doc["kind"] == "probe" and doc["data"].get("probe") == "doctor":
        return {"doctor": doc["data"]}
    return {}


def _grid(title: str, per_file: list[dict], fmt=lambda v: v) -> Table | None:
    """Rows = union of keys over files, columns = files."""
    keys = []
    for d in per_file:
        keys += [k for k in d if k not in keys]
    if not keys:
        return None
    rows = [[k] + [fmt(d[k]) if k in d else "-" for d in per_file] for k in keys]
    return Table(title, ["", *[f"#{i + 1}" for i in range(len(per_file))]], rows)


def audit_rows(a: dict) -> dict:
    out = {f"{k} settings": v for k, v in a["summary"].items()}
    out.update({r["setting"]: f"{r['current_text']} ({r['status']})" for r in a["settings"]})
    return out


def events_rows(e: dict) -> dict:
    out = {}
    for p in e["idle"]:
        if p["available"] and p["k"] == 1 and p["ready"] == "hot":
            out[f"{p['backend']}, N={p['n']:,}"] = p["ns_per_call"]["median"]
    ns = sorted({int(k.rsplit("=", 1)[1].replace(",", "")) for k in out})
    keep = {n for n in ns if n in (1, 100, 1000) or n == ns[-1]} if ns else set()
    return {k: f"{v:,.0f} ns" for k, v in out.items() if int(k.rsplit("=", 1)[1].replace(",", "")) in keep}


def fdscan_rows(f: dict) -> dict:
    return {f"variant {p['variant']}, N={p['n']:,}": f"{p['ns_per_call']['median']:,.0f} ns" for p in f["points"]
            if p["n"] in (1000, 10000)}


def storage_rows(s: dict) -> dict:
    out = {}
    for c in s["combos"]:
        if c["available"] and (c["fs"] in ("ext4", "raw")) and c["atime"] in ("relatime", "-"):
            key = f"{c['fs']} {c['store']} {c['engine']}"
            out[f"{key}: fill obj/s"] = f"{c['fill_objects_per_s']:,.0f}"
            out[f"{key}: steady obj/s"] = f"{c['steady_objects_per_s']:,.0f}"
    out.update({f"fill largefile/ufs {k}": f"x{v:.1f}" for k, v in s["fill_ratio_largefile_over_ufs"].items()
                if k.startswith("ext4")})
    return out


def proxy_rows(p: dict) -> dict:
    several = len({s.get("proxy", "squid") for s in p["stores"]}) > 1
    labels = (["before", "after"] if p.get("compare_profile") else
              [f"{s.get('proxy', 'squid')} {s['store']}" if several else s["store"] for s in p["stores"]])
    out = {}
    for lab, s in zip(labels, p["stores"]):
        out[f"{lab}: req/s"] = f"{s['steady']['rps']:,.0f}"
        out[f"{lab}: hit ratio"] = "-" if s["hit_ratio"] is None else f"{s['hit_ratio']:.2f}"
        out[f"{lab}: errors"] = f"{s['error_count']:,}"
    return out


def doctor_rows(d: dict) -> dict:
    return {f["id"]: f"{f['severity']}: {f['title']}" for f in d["findings"]} or {"findings": "none"}


def _extract(fn, part: dict) -> dict:
    """One file's rows of a section; a result that fits the schema but not these rows is n/a, with why."""
    try:
        return fn(part)
    except RENDER_ERRORS as e:
        return {"n/a": unrenderable(e)}


def compare(docs: list[dict], names: list[str]) -> dict:
    """A compare document: host columns, then one grid per section kind any file has."""
    per = [sections_of(d) for d in docs]
    hosts = [{**{k: d["host"].get(k) for k in ("hostname", "os", "kernel", "cpu_model", "cores", "virtualised")},
              "file": n, "kind": d["kind"], "created": d["created"]} for d, n in zip(docs, names)]
    out = [_grid("Hosts and files", hosts, str)]
    from .measurements import MEASUREMENTS
    for m in MEASUREMENTS:
        if m.compare and any(m.name in p for p in per):
            title, fn = m.compare
            out.append(_grid(title, [_extract(fn, p[m.name]) if m.name in p else {} for p in per], str))
    return {"tables": [t for t in out if t], "names": names}


def render_markdown(c: dict) -> str:
    from .markdown import md_text, table
    lines = ["# proxytune compare\n"] + [f"- #{i + 1}: {md_text(n)}" for i, n in enumerate(c["names"])] + [""]
    return "\n".join(lines + [table(t, "##") for t in c["tables"]])


def render_html(c: dict) -> str:
    from .html import CSS, html_text, table
    body = ["<h1>proxytune compare</h1>", "<ul>" + "".join(f"<li>#{i + 1}: <code>{html_text(n)}</code></li>"
                                                              for i, n in enumerate(c["names"])) + "</ul>"]
    body += [table(t, "h2") for t in c["tables"]]
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><title>proxytune compare</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write(docs: list[dict], paths: list[Path], out_dir: Path) -> list[Path]:
    from .build import write_files
    c = compare(docs, [str(p) for p in paths])
    return write_files(out_dir, {"compare.md": render_markdown(c), "compare.html": render_html(c)})

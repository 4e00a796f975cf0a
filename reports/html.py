"""Result JSON -> one self-contained HTML page: inline CSS, no scripts,
nothing fetched from a network, so it opens anywhere (and in CI's Chromium)."""

import html as h

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.6em 0 1.4em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.met,.ok{color:#17802c}.drift,.warn{color:#a66300;font-weight:600}.error{color:#b00020;font-weight:600}
.na{color:#888}code{background:#f5f5f5;padding:0 3px}h1{margin-bottom:0}.sub{color:#666}
"""


def _e(v) -> str:
    if isinstance(v, list):
        v = " ".join(str(x) for x in v)
    return h.escape(str("-" if v is None else v))


def table(headers: list[str], rows: list[list], status_col: int | None = None) -> str:
    out = ["<table><tr>" + "".join(f"<th>{_e(x)}</th>" for x in headers) + "</tr>"]
    for r in rows:
        cells = []
        for i, c in enumerate(r):
            cls = {"n/a": "na"}.get(c, c) if i == status_col else ""
            cells.append(f'<td class="{_e(cls)}">{_e(c)}</td>' if cls else f"<td>{_e(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


def host_html(host: dict) -> str:
    rows = [[k, host[k]] for k in ("hostname", "os", "kernel", "cpu_model", "cores", "memory_kib", "virtualised")
            if k in host]
    rows += [[f"fs {f['path']}", f"{f.get('fstype')} on {f.get('mountpoint', '?')} ({f.get('options', '')})"]
             for f in host.get("filesystems", [])]
    return table(["host", "value"], rows)


def audit_html(a: dict) -> str:
    s = a["summary"]
    out = [f"<h2>Host audit: profile <code>{_e(a['profile'])}</code></h2>",
           f"<p>{s['met']} met, {s['drift']} drift, {s['n/a']} not applicable, {s['error']} error.</p>",
           table(["setting", "current", "wanted", "status", "reason / note"],
                 [[r["setting"], r["current_text"], r["wanted_text"],
                   r["status"], r["note"] or r["reason"]] for r in a["settings"]], status_col=3)]
    out += [f"<p class=sub>note: {_e(n)}</p>" for n in a.get("notes", [])]
    obs = a["observations"]
    if obs["processes"]:
        out.append(f"<h3>Running {_e(obs['service'])} processes</h3>")
        out.append(table(["pid", "nofile soft", "nofile hard", "fds open", "status", "note"],
                         [[p["pid"], p["nofile_soft"], p["nofile_hard"], p["fds_open"], p["status"], p["note"]]
                          for p in obs["processes"]], status_col=4))
    else:
        out.append(f"<p class=sub>No running {_e(obs['service'])} process to inspect.</p>")
    if obs["listeners"]:
        out.append("<h3>Listen sockets</h3>")
        out.append(table(["address", "queued", "backlog", "status", "note"],
                         [[l["local"], l["queued"], l["backlog"], l["status"], l["note"]] for l in obs["listeners"]],
                         status_col=3))
    if obs["cache_dirs"]:
        out.append("<h3>Cache directories</h3>")
        out.append(table(["path", "mount", "atime", "status", "note"],
                         [[d["path"], d.get("mountpoint"), d.get("atime"), d["status"], d["note"]]
                          for d in obs["cache_dirs"]], status_col=3))
    return "\n".join(out)


def render(doc: dict) -> str:
    d = doc["data"]
    body = [f"<h1>{_e(d['title'])}</h1>", f"<p class=sub>created {_e(doc['created'])}</p>",
            "<h2>Host</h2>", host_html(doc["host"])]
    if "audit" in d["sections"]:
        body.append(audit_html(d["sections"]["audit"]))
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><title>proxytune report</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")

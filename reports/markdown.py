"""Result JSON -> Markdown (for pull requests, tickets, docs)."""


def _cell(v) -> str:
    if isinstance(v, list):
        v = " ".join(str(x) for x in v)
    return str("-" if v is None else v).replace("|", "\\|")


def table(headers: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def host_table(host: dict) -> str:
    rows = [[k, host[k]] for k in ("hostname", "os", "kernel", "cpu_model", "cores", "memory_kib", "virtualised")
            if k in host]
    rows += [[f"fs {f['path']}", f"{f.get('fstype')} on {f.get('mountpoint', '?')} ({f.get('options', '')})"]
             for f in host.get("filesystems", [])]
    return table(["host", "value"], rows)


def audit_md(a: dict) -> str:
    s = a["summary"]
    out = [f"## Host audit: profile `{a['profile']}`\n",
           f"{s['met']} met, {s['drift']} drift, {s['n/a']} not applicable, {s['error']} error.\n"]
    out.append(table(["setting", "current", "wanted", "status", "reason"],
                     [[r["setting"], r["current_text"], r["wanted_text"],
                       r["status"], r["note"] or r["reason"]] for r in a["settings"]]))
    for n in a.get("notes", []):
        out.append(f"- note: {n}\n")
    obs = a["observations"]
    if obs["processes"]:
        out.append(f"\n### Running {obs['service']} processes\n")
        out.append(table(["pid", "nofile soft", "nofile hard", "fds open", "status", "note"],
                         [[p["pid"], p["nofile_soft"], p["nofile_hard"], p["fds_open"], p["status"], p["note"]]
                          for p in obs["processes"]]))
    else:
        out.append(f"\nNo running {obs['service']} process to inspect.\n")
    if obs["listeners"]:
        out.append("\n### Listen sockets\n")
        out.append(table(["address", "queued", "backlog", "status", "note"],
                         [[l["local"], l["queued"], l["backlog"], l["status"], l["note"]] for l in obs["listeners"]]))
    if obs["cache_dirs"]:
        out.append("\n### Cache directories\n")
        out.append(table(["path", "mount", "atime", "status", "note"],
                         [[d["path"], d.get("mountpoint"), d.get("atime"), d["status"], d["note"]]
                          for d in obs["cache_dirs"]]))
    return "\n".join(out)


def render(doc: dict) -> str:
    d = doc["data"]
    out = [f"# {d['title']}\n", f"Created {doc['created']}.\n", host_table(doc["host"])]
    if "audit" in d["sections"]:
        out.append(audit_md(d["sections"]["audit"]))
    return "\n".join(out)

"""The report's content as tables, once; markdown.py and html.py only format them."""

from dataclasses import dataclass


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list]
    status_col: int | None = None


def host_table(host: dict) -> Table:
    rows = [[k, host[k]] for k in ("hostname", "os", "kernel", "cpu_model", "cores", "memory_kib", "virtualised")
            if k in host]
    rows += [[f"fs {f['path']}", f"{f.get('fstype')} on {f.get('mountpoint', '?')} ({f.get('options', '')})"]
             for f in host.get("filesystems", [])]
    return Table("Host", ["host", "value"], rows)


def audit_summary(a: dict) -> str:
    s = a["summary"]
    return f"{s['met']} met, {s['drift']} drift, {s['n/a']} not applicable, {s['error']} error."


def audit_tables(a: dict) -> list[Table]:
    """The settings table, then whatever the running proxy showed."""
    tables = [Table(f"Host audit: profile {a['profile']}", ["setting", "current", "wanted", "status", "reason / note"],
                    [[r["setting"], r["current_text"], r["wanted_text"], r["status"], r["note"] or r["reason"]]
                     for r in a["settings"]], status_col=3)]
    obs = a["observations"]
    if obs["processes"]:
        tables.append(Table(f"Running {obs['service']} processes",
                            ["pid", "nofile soft", "nofile hard", "fds open", "status", "note"],
                            [[p["pid"], p["nofile_soft"], p["nofile_hard"], p["fds_open"], p["status"], p["note"]]
                             for p in obs["processes"]], status_col=4))
    if obs["listeners"]:
        tables.append(Table("Listen sockets", ["address", "queued", "backlog", "status", "note"],
                            [[l["local"], l["queued"], l["backlog"], l["status"], l["note"]]
                             for l in obs["listeners"]], status_col=3))
    if obs["cache_dirs"]:
        tables.append(Table("Cache directories", ["path", "mount", "atime", "status", "note"],
                            [[d["path"], d.get("mountpoint"), d.get("atime"), d["status"], d["note"]]
                             for d in obs["cache_dirs"]], status_col=3))
    return tables


def audit_notes(a: dict) -> list[str]:
    notes = list(a.get("notes", []))
    obs = a["observations"]
    if not obs["processes"]:
        notes.append(f"no running {obs['service']} process to inspect")
    return notes

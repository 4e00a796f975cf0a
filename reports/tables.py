"""The report's content, once, as sections of tables, figures and notes;
markdown.py and html.py only format them."""

from dataclasses import dataclass, field

from . import plots


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list]
    status_col: int | None = None


@dataclass
class Figure:
    name: str           # file name in the report directory
    caption: str
    png: bytes


@dataclass
class Section:
    title: str
    intro: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def host_table(host: dict) -> Table:
    rows = [[k, host[k]] for k in ("hostname", "os", "kernel", "cpu_model", "cores", "memory_kib", "virtualised")
            if k in host]
    rows += [[f"fs {f['path']}", f"{f.get('fstype')} on {f.get('mountpoint', '?')} ({f.get('options', '')})"]
             for f in host.get("filesystems", [])]
    return Table("Host", ["host", "value"], rows)


def audit_section(a: dict) -> Section:
    s = a["summary"]
    sec = Section(f"Host audit: profile {a['profile']}",
                  f"{s['met']} met, {s['drift']} drift, {s['n/a']} not applicable, {s['error']} error.")
    sec.tables.append(Table("Settings", ["setting", "current", "wanted", "status", "reason / note"],
                            [[r["setting"], r["current_text"], r["wanted_text"], r["status"], r["note"] or r["reason"]]
                             for r in a["settings"]], status_col=3))
    obs = a["observations"]
    if obs["processes"]:
        sec.tables.append(Table(f"Running {obs['service']} processes",
                                ["pid", "nofile soft", "nofile hard", "fds open", "status", "note"],
                                [[p["pid"], p["nofile_soft"], p["nofile_hard"], p["fds_open"], p["status"], p["note"]]
                                 for p in obs["processes"]], status_col=4))
    else:
        sec.notes.append(f"no running {obs['service']} process to inspect")
    if obs["listeners"]:
        sec.tables.append(Table("Listen sockets", ["address", "queued", "backlog", "status", "note"],
                                [[l["local"], l["queued"], l["backlog"], l["status"], l["note"]]
                                 for l in obs["listeners"]], status_col=3))
    if obs["cache_dirs"]:
        sec.tables.append(Table("Cache directories", ["path", "mount", "atime", "status", "note"],
                                [[d["path"], d.get("mountpoint"), d.get("atime"), d["status"], d["note"]]
                                 for d in obs["cache_dirs"]], status_col=3))
    sec.notes += a.get("notes", [])
    return sec


def events_section(r: dict) -> Section:
    sec = Section("Event mechanisms: select / poll / epoll / io_uring / kqueue",
                  "Cost of one wait call against the number of idle descriptors watched "
                  f"({'quick grid' if r['quick'] else 'full sweep'}; median of repetitions).")
    pts = [p for p in r["idle"] if p["available"] and p["ready"] == "hot" and p["k"] == 1]
    ns = sorted({p["n"] for p in pts})
    rows = []
    for be in sorted({p["backend"] for p in pts}):
        by_n = {p["n"]: p for p in pts if p["backend"] == be}
        rows.append([be] + [f"{by_n[n]['ns_per_call']['median']:,.0f}" if n in by_n else "" for n in ns]
                    + [f"x{r['scaling'][be]['ratio']:.1f}" if be in r.get("scaling", {}) else "-"])
    sec.tables.append(Table("ns per wait call, 1 ready (hot)", ["mechanism"] + [f"N={n}" for n in ns]
                            + ["N=max / N=100"], rows))
    sec.tables.append(Table("Availability", ["mechanism", "available", "reason"],
                            [[b["name"], "yes" if b["available"] else "no", b["reason"]] for b in r["backends"]]))
    if r["churn"]:
        sec.tables.append(Table("Churn: register + deregister one descriptor per request (N=1000 watched)",
                                ["mechanism", "ns per request", "ns with one wait between"],
                                [[c["backend"], f"{c['ns_per_request']['median']:,.0f}",
                                  f"{c['ns_per_request_with_wait']['median']:,.0f}"] for c in r["churn"]]))
    for name, png, caption in (("events-cost.png", plots.events_cost(r["idle"]), "Cost per wait call, log-log"),
                               ("events-batching.png", plots.events_batching(r["load"]), "Events per call as load rises")):
        if png:
            sec.figures.append(Figure(name, caption, png))
    if r.get("crossover_poll_epoll"):
        sec.notes.append(f"poll against epoll: poll {r['crossover_poll_epoll']['note']}")
    pb = r.get("perf_bench_epoll", {})
    if pb.get("available"):
        sec.notes.append(f"outside reference: `{pb['command']}`: {pb['ops_per_s']:,} ops/s")
    if r.get("noisy_points"):
        sec.notes.append(f"{r['noisy_points']} point(s) ran while the machine was busy")
    return sec


def fdscan_section(r: dict) -> Section:
    sec = Section("Mogul's comm_select fix, on this CPU",
                  "Building select()'s interest sets from an fd table of N entries, five ways "
                  f"(D1 misses from {r['miss_source']}: {r['miss_source_note']}).")
    ns = sorted({p["n"] for p in r["points"]})
    misses = {m["variant"]: m["d1_misses_per_call"] for m in r["misses"]}
    rows = []
    for v, name in r["variants"].items():
        by_n = {p["n"]: p for p in r["points"] if p["variant"] == int(v)}
        rows.append([f"{v}: {name}"] + [f"{by_n[n]['ns_per_call']['median']:,.0f}" for n in ns]
                    + [f"{misses[int(v)]:,.0f}" if int(v) in misses else "-"])
    sec.tables.append(Table("ns per call", ["variant"] + [f"N={n}" for n in ns] + ["D1 misses / call"], rows))
    png = plots.fdscan(r["points"], r["misses"], r["variants"])
    if png:
        sec.figures.append(Figure("fdscan.png", "comm_select variants: cost and D1 misses", png))
    if "miss_ratio_1_over_3" in r:
        sec.notes.append(f"variant 1 has {r['miss_ratio_1_over_3']:.1f}x the D1 misses of variant 3; "
                         f"fastest at the largest N: variant {r['fastest_at_largest_n']}")
    return sec


SECTIONS = {"audit": audit_section, "events": events_section, "fdscan": fdscan_section}


def sections(doc: dict) -> list[Section]:
    return [SECTIONS[name](data) for name, data in doc["data"]["sections"].items() if name in SECTIONS]

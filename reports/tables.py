"""The report's content, once, as sections of tables, figures and notes;
markdown.py and html.py only format them."""

from proxytune.core.sections import RENDER_ERRORS, Figure, Section, Table, unrenderable
from proxytune.microbench import fio, hostsettings

from . import latency, plots, verdicts


def host_table(host: dict) -> Table:
    rows = [[k, host[k]] for k in ("hostname", "os", "kernel", "cpu_model", "cores", "memory_kib", "virtualised")
            if k in host]
    rows += [[f"fs {f['path']}", f"{f.get('fstype')} on {f.get('mountpoint', '?')} ({f.get('options', '')})"]
             for f in host.get("filesystems", [])]
    return Table("Host", ["host", "value"], rows)


SPREAD = "spread (IQR/median, worst)"


def spread(stats) -> str:
    """The worst IQR/median of a row's points: how far a reader may trust its medians."""
    rel = [st["iqr_rel"] for st in stats if isinstance(st, dict) and st.get("iqr_rel") is not None]
    return f"{max(rel):.0%}" if rel else "-"


def rep_spread(runs: list[dict], c: dict) -> str:
    """max/min of fill and steady objects/s over the repetitions of one combination."""
    same = [x for x in runs if all(x[k] == c[k] for k in ("fs", "atime", "store", "engine"))]
    out = []
    for phase in ("fill", "steady"):
        v = [x[phase]["objects_per_s"] for x in same if (x.get(phase) or {}).get("objects_per_s")]
        out.append(f"x{max(v) / min(v):.2f}" if len(v) > 1 else "one run")
    return " · ".join(out)


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
                    + [f"x{r['scaling'][be]['ratio']:.1f}" if be in r.get("scaling", {}) else "-",
                       spread(p["ns_per_call"] for p in by_n.values())])
    sec.tables.append(Table("ns per wait call, 1 ready (hot)", ["mechanism"] + [f"N={n}" for n in ns]
                            + ["N=max / N=100", SPREAD], rows))
    sec.tables.append(Table("Availability", ["mechanism", "available", "reason"],
                            [[b["name"], "yes" if b["available"] else "no", b["reason"]] for b in r["backends"]]))
    if r["churn"]:
        sec.tables.append(Table("Churn: register + deregister one descriptor per request (N=1000 watched)",
                                ["mechanism", "ns per request", "ns with one wait between", SPREAD],
                                [[c["backend"], f"{c['ns_per_request']['median']:,.0f}",
                                  f"{c['ns_per_request_with_wait']['median']:,.0f}",
                                  spread([c["ns_per_request"], c["ns_per_request_with_wait"]])] for c in r["churn"]]))
    sec.figures += [Figure("events-cost.png", "Cost per wait call, log-log", lambda: plots.events_cost(r["idle"])),
                    Figure("events-batching.png", "Events per call as load rises", lambda: plots.events_batching(r["load"]))]
    if r.get("crossover_poll_epoll"):
        sec.notes.append(f"poll against epoll: poll {r['crossover_poll_epoll']['note']}")
    for be, f in sorted(r.get("fits", {}).items()):
        if f["b_ns_per_fd"] is not None:
            per_ready = f" + {f['c_ns_per_ready']:.1f}*K" if f["c_ns_per_ready"] is not None else ""
            sec.notes.append(f"fit {be}: t = {f['a_ns']:.0f} + {f['b_ns_per_fd']:.2f}*N{per_ready} ns")
    if r["load"]:
        sec.notes.append("events per call as load rises (20 us of work per event): " + "; ".join(
            f"{l['backend']} {l['offered_per_s']}/s: {l['events_per_call']:.2f}" for l in r["load"]))
    pb = r.get("perf_bench_epoll", {})
    sec.notes.append(f"outside reference: `{pb['command']}`: {pb['ops_per_s']:,} ops/s" if pb.get("available")
                     else f"perf bench epoll wait: unavailable: {pb.get('reason', 'not run')}")
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
        rows.append([f"{v}: {name}"] + [f"{by_n[n]['ns_per_call']['median']:,.0f}" if n in by_n else "" for n in ns]
                    + [f"{misses[int(v)]:,.0f}" if int(v) in misses else "-",
                       spread(p["ns_per_call"] for p in by_n.values())])
    sec.tables.append(Table("ns per call", ["variant"] + [f"N={n}" for n in ns] + ["D1 misses / call", SPREAD], rows))
    sec.figures.append(Figure("fdscan.png", "comm_select variants: cost and D1 misses",
                              lambda: plots.fdscan(r["points"], r["misses"], r["variants"])))
    if "miss_ratio_1_over_3" in r:
        sec.notes.append(f"variant 1 has {r['miss_ratio_1_over_3']:.1f}x the D1 misses of variant 3; "
                         f"fastest at the largest N: variant {r['fastest_at_largest_n']}")
    return sec


def _storage_reps(r: dict) -> str:
    reps, seed = r.get("reps", 1), r.get("seed_reps")
    others = "one repetition each: no spread" if reps == 1 else f"medians of {reps} repetitions"
    if not seed:                          # a result from before the seed rounds
        return others
    if not reps:
        return (f"the seed rows' cells only, medians of {seed} rounds: the other cells and fio's limits run in "
                "report --full")
    return f"the seed rows' cells ({r.get('seed_engine')}): medians of {seed} rounds; the others: {others}"


def storage_section(r: dict) -> Section:
    sec = Section("Object stores: ufs vs largefile vs rawdev",
                  f"PolyMix-3 mix, {r['capacity_mb']} MiB cache; fill writes it twice (final sync timed), steady "
                  "is Zipf-popular hits and misses, hit is cached objects alone; each phase from a cold page cache. "
                  f"Syscalls counted by {r['syscall_counting']}.")
    fmt = lambda v, f="{:,.0f}": "-" if v is None else f.format(v)
    rows = []
    for c in r["combos"]:
        if not c["available"]:
            rows.append([c["fs"], c["atime"], c["store"], c["engine"], "unavailable: " + c["reason"]] + [""] * 9)
            continue
        rows.append([c["fs"], c["atime"], c["store"], c["engine"], fmt(c["fill_objects_per_s"]),
                     fmt(c["steady_objects_per_s"]), fmt(c["steady_hit_ratio"], "{:.2f}"),
                     fmt((c["steady_latency_us"] or {}).get("p99")), fmt(c["fill_syscalls_per_object"], "{:.2f}"),
                     fmt(c["steady_syscalls_per_object"], "{:.2f}"), fmt(c["steady_cpu_us_per_object"], "{:.1f}"),
                     fio.cell(c, "fill"), fio.cell(c, "steady"), rep_spread(r["runs"], c)])
    sec.tables.append(Table(f"Throughput and cost per object ({_storage_reps(r)})",
                            ["fs", "atime", "store", "engine", "fill obj/s", "steady obj/s", "hit ratio",
                             "steady p99 us", "syscalls/obj fill", "syscalls/obj steady", "cpu us/obj steady", "fill / fio",
                             "steady / fio", "max/min over reps, fill · steady"], rows))
    limits = [f for f in r["fio"] if f.get("available")]
    if limits:
        sec.tables.append(Table("fio limits (each store engine's own fio engine and depth, same mix, file size "
                                "and cold start)", ["job", "target", "engine", "MB/s (best)", "all runs MB/s"],
                                [[f["name"], f["target"], f.get("engine", "psync"), f"{f['mb_per_s']:,.1f}",
                                  " ".join(f"{x:,.0f}" for x in f.get("runs_mb_per_s", [])) or "one run"]
                                 for f in limits]))
    sec.notes += [f"{c['fs']}/{c['atime']}/{c['store']}/{c['engine']} {phase}: {c[phase + '_fio_error']}"
                  for c in r["combos"] for phase in ("fill", "steady") if c.get(f"{phase}_fio_error")]
    sec.figures += [
        Figure("storage-throughput.png", "Objects per second by store and engine",
               lambda: plots.storage_throughput(r["combos"])),
        Figure("storage-latency.png", "I/O latency percentiles, steady phase", lambda: plots.storage_latency(r["combos"])),
        Figure("storage-fs.png", "Filesystems, relatime vs noatime", lambda: plots.storage_fs_matrix(r["combos"]))]
    for k, v in r["fill_ratio_largefile_over_ufs"].items():
        sec.notes.append(f"fill, largefile / ufs on {k}: x{v:.1f}")
    for k, v in r["noatime_effect"].items():
        sec.notes.append(f"hits alone on {k}: relatime {v['relatime_hit_objects_per_s']:,.0f} obj/s with "
                         f"{v['relatime_hit_write_ios']} device writes, noatime {v['noatime_hit_objects_per_s']:,.0f} "
                         f"obj/s with {v['noatime_hit_write_ios']}")
    for fs, why in r["fs_skipped"].items():
        sec.notes.append(f"{fs} skipped: {why}")
    return sec


PROXY_HEADERS = ["run", "store", "nofile", "fill req/s", "req/s", "MB/s", "hit ratio", "p50 ms", "p99 ms",
                 "hit p50 ms", "miss p50 ms", "syscalls/req", "writes KB/req", "errors"]


def proxy_rows(r: dict) -> tuple[list[str], list[list]]:
    """(run labels, table rows) of a bench proxy result: one row per proxy and store run."""
    labels = [s["label"] + (f" #{s['round'] + 1}" if "round" in s else "") if s.get("label") else
              (("before", "after")[i] if r.get("compare_profile") and i < 2 else "") for i, s in enumerate(r["stores"])]
    ms = lambda v: "-" if v is None else f"{v / 1000:,.1f}"
    num = lambda v, f: "-" if v is None else format(v, f)
    rows = []
    for lab, s in zip(labels, r["stores"]):
        lat, probe, cost = s["steady"]["latency_us"], s["latency_probe"], s.get("cost") or {}
        rows.append([lab or s.get("proxy", "squid"), s["store"], s["nofile"][0] if s["nofile"] else "-",
                     f"{s['fill']['rps']:,.0f}", f"{s['steady']['rps']:,.0f}", f"{s['steady']['mb_per_s']:,.1f}",
                     "-" if s["hit_ratio"] is None else f"{s['hit_ratio']:.2f}", ms(lat["p50"]), ms(lat["p99"]),
                     ms((probe.get("hit") or {}).get("p50")), ms((probe.get("miss") or {}).get("p50")),
                     num(cost.get("syscalls_per_request"), ",.1f"), num(cost.get("device_write_kb_per_request"), ",.2f"),
                     f"{s['error_count']:,}"])
    return labels, rows


def proxy_section(r: dict) -> Section:
    p = r["plan"]
    compare = r.get("compare_profile")
    names = sorted({s.get("proxy", "squid") for s in r["stores"]})
    sec = Section(f"{', '.join(names)} under load: " + (f"before and after {compare}" if compare else "stores"),
                  f"Debian's {', '.join(names)}, {p['concurrency']} wrk connections plus {p['idle']} idle keep-alive clients, "
                  f"{p['fill_s']} s fill then {p['steady_s']} s steady; {r['docroot']['files']} PolyMix-3 objects "
                  f"(mean {r['docroot']['mean_kb']:.1f} KB) on an nginx origin; a new URL or, with probability "
                  f"{r['repeat']}, a repeat. Hit ratio from each proxy's own log or counters (X-Cache where it has "
                  "none); hit/miss latency from a sequential probe during steady; syscalls (perf stat, "
                  "raw_syscalls:sys_enter) and device writes (/proc/PID/io write_bytes) of the proxy's processes "
                  "per request served during steady. "
                  + (f"Before and after in {len(r['rounds'])} alternating rounds (the seed row's pairs)"
                     + (", each side one Squid kept running (one fill, its idle clients held) with a steady window "
                        "a round, its cache on a new filesystem" if any("window" in s for s in r["stores"]) else "")
                     + (", after a warm-up window not counted" if any(s.get("label") == hostsettings.WARM_UP
                                                                      for s in r["stores"]) else "") + "; "
                     if r.get("rounds") else "One run per store: req/s carries no repetition spread "
                     "(compare rows of one result, not across results); ")
                  + "p50/p99 give the latency spread.")
    labels, rows = proxy_rows(r)
    sec.tables.append(Table("Steady phase", PROXY_HEADERS, rows))
    sec.figures.append(Figure("proxy.png", "Throughput and errors per run", lambda: plots.proxy_bars(r["stores"], labels)))
    for lab, s in zip(labels, r["stores"]):
        e = s["errors"]
        sec.notes.append(f"{lab or s.get('proxy', 'squid')} {s['store']}: wrk socket errors {e['wrk_socket']}, HTTP errors {e['http_status']}, "
                         f"squid codes {e['squid_codes']}, idle clients refused {e['idle_clients_failed']} / "
                         f"dropped {e['idle_clients_dropped']}, fd warnings in cache.log {e['fd_warnings_in_cache_log']}")
    sec.notes += latency.notes(r["stores"], labels)
    if compare:
        n = r["service_nofile"]
        sec.notes.append(f"{r.get('proxy', 'squid')}'s nofile {n['before']} -> {n['after']}"
                         + (f", capped at this host's hard limit {n['hard_limit_here']}" if n["capped"] else "")
                         + f"; applied {len(r['applied'])} step(s), rolled back: {r['rolled_back']}")
    if len({(s.get("proxy", "squid"), s["store"]) for s in r["stores"]}) > 2 and not compare:
        from proxytune.microbench import storequestion as sq
        heads, rows = sq.table_rows(r["stores"])
        sec.tables.append(Table("The storage question on real caches: each store's design", heads, rows))
        sec.tables.append(Table("What each design predicts, and whether it held",
                                ["prediction", "metric", "run", "against", "verdict"], sq.verdict_rows(r["stores"])))
    return sec


def summary_section(items: list[dict]) -> Section:
    sec = Section("What to do on this host first",
                  "Ranked: what a watched proxy runs into now, then settings below the profile, then the choices "
                  "this host's benches measured, by the factor measured.")
    sec.tables.append(Table("Actions", ["#", "what", "why (measured here)", "command", "from"],
                            [[i["rank"], i["what"], i["why"], i["command"], i["source"]] for i in items]))
    if not items:
        sec.notes.append("nothing to do: every selected setting is met and no bench favoured a change")
    return sec


def _interval(x: dict) -> str:
    if not x.get("interval"):
        return "-"
    lo, hi = x["interval"]
    return f"x{lo:,.2f} to x{hi:,.2f} ({x.get('reps', 0)} {x.get('unit', 'pairs')})"


def seeds_section(r: dict) -> Section:
    sec = Section("The classic results, today",
                  "Each headline of the reference papers against this run's own measurements, A and B alternating in "
                  "pairs; the ratio is the pairs' median, with their interval. Effects compare on a log scale: holds "
                  "(within x2 of the original effect), grew / shrank (beyond x2), reversed (the advice costs over 10%). "
                  f"A verdict only when the whole interval lies in its range, {verdicts.EDGE_MARGIN:.0%} clear of its "
                  "edges (a row's median moves about that much from one report to the next), and comes from "
                  f"{verdicts.MIN_REPS} pairs at least (their range holds the median in "
                  f"{verdicts.order_coverage(verdicts.MIN_REPS):.0%} of runs, 3 pairs' in 75%); else inconclusive here "
                  "(docs/BENCHMARKS.md \"The verdict rule\").")
    sec.tables.append(Table("Seeds", ["seed", "claim", "original", "today", "ratio", "interval", "verdict", "reason",
                                      "computed from"],
                            [[x["seed"], x["claim"], x["original"], x["today"],
                              "-" if x["ratio"] is None else f"x{x['ratio']:,.2f}", _interval(x), x["verdict"],
                              x["reason"], x.get("cells") or "-"]
                             for x in r["rows"]], status_col=6))
    return sec


def renderer(name: str):
    """The function that makes a part's section (its measurement's, reports/measurements.py), or None."""
    from .measurements import by_name
    if name == "seeds":
        return seeds_section
    m = by_name(name)
    return m.section if m else None


def section_for(name: str, data: dict) -> Section:
    """The section of one result part; a bench whose harness could not run says so and why."""
    if data.get("available") is False:
        return Section(f"bench {name}: unavailable", data["reason"])
    try:
        sec = renderer(name)(data)
    except RENDER_ERRORS as e:      # a saved result that fits the schema but not this section
        return Section(f"{name}: n/a", f"this result could not be shown: {unrenderable(e)}")
    sec.notes += [f"not measured: {' '.join(str(v) for k, v in p.items() if k not in ('available', 'reason'))}: "
                  f"{p['reason']}" for p in data.get("unavailable_points", [])]
    return sec


def sections(doc: dict) -> list[Section]:
    """The summary first (when the document has one), the seeds next, then the measured sections in order."""
    secs = doc["data"]["sections"]
    order = ["seeds"] + [n for n in secs if n != "seeds"]
    out = [summary_section(doc["data"]["summary"])] if "summary" in doc["data"] else []
    return out + [section_for(name, secs[name]) for name in order if name in secs and renderer(name)]

"""Terminal tables for bench results (rich); --json prints the data instead."""

from rich.table import Table

from proxytune.core.console import console

from . import fio


def events_table(r: dict) -> None:
    out = console()
    unavailable = [b for b in r["backends"] if not b["available"]]
    for b in unavailable:
        out.print(f"[dim]{b['name']}: unavailable: {b['reason']}[/]")
    idle = [p for p in r["idle"] if p["available"]]
    for ready in ("hot", "cold"):
        pts = [p for p in idle if p["ready"] == ready]
        if not pts:
            continue
        ns = sorted({p["n"] for p in pts})
        t = Table(title=f"ns per wait call, {ready} ({'same K ready each call' if ready == 'hot' else 'ready K rotate over N'}); "
                        "median of reps", title_justify="left")
        t.add_column("backend")
        t.add_column("K")
        for n in ns:
            t.add_column(f"N={n}", justify="right")
        for be, k in sorted({(p["backend"], p["k"]) for p in pts}):
            row = [be, str(k)]
            for n in ns:
                p = next((x for x in pts if x["backend"] == be and x["k"] == k and x["n"] == n), None)
                row.append("" if p is None else f"{p['ns_per_call']['median']:,.0f}"
                           + (" [yellow]noisy[/]" if p["noisy"] else ""))
            t.add_row(*row)
        out.print(t)
    if r.get("scaling"):
        out.print("scaling N=100 -> N=max: " + ", ".join(
            f"{be} x{s['ratio']:.1f}" for be, s in sorted(r["scaling"].items())))
    if r.get("crossover_poll_epoll"):
        out.print(f"poll vs epoll: poll {r['crossover_poll_epoll']['note']}")
    for be, f in sorted(r.get("fits", {}).items()):
        if f["b_ns_per_fd"] is not None:
            c = f" + {f['c_ns_per_ready']:.1f}*K" if f["c_ns_per_ready"] is not None else ""
            out.print(f"fit {be}: t = {f['a_ns']:.0f} + {f['b_ns_per_fd']:.2f}*N{c} ns")
    if r["churn"]:
        out.print("churn (register + deregister per request, N=1000): " + ", ".join(
            f"{c['backend']} {c['ns_per_request']['median']:,.0f} ns ({c['ns_per_request_with_wait']['median']:,.0f} with a wait)"
            for c in r["churn"]))
    if r["load"]:
        out.print("events per call as load rises (20 us of work per event): " + "; ".join(
            f"{l['backend']} {l['offered_per_s']}/s: {l['events_per_call']:.2f}" for l in r["load"]))
    pb = r.get("perf_bench_epoll", {})
    out.print(f"perf bench epoll wait: {pb['ops_per_s']:,} ops/s ({pb['ns_per_op']:.0f} ns/op)" if pb.get("available")
              else f"[dim]perf bench epoll wait: {pb.get('reason')}[/]")
    if r.get("noisy_points"):
        out.print(f"[yellow]{r['noisy_points']} point(s) ran while the machine was busy (cpu share < 0.9): repeat them[/]")


def fdscan_table(r: dict) -> None:
    out = console()
    ns = sorted({p["n"] for p in r["points"]})
    t = Table(title="comm_select variants: ns per call (build interest sets + scan result)", title_justify="left")
    t.add_column("variant")
    for n in ns:
        t.add_column(f"N={n}", justify="right")
    t.add_column("D1 misses/call", justify="right")
    misses = {m["variant"]: m["d1_misses_per_call"] for m in r["misses"]}
    for v, name in r["variants"].items():
        row = [f"{v} {name}"]
        for n in ns:
            p = next(x for x in r["points"] if x["variant"] == int(v) and x["n"] == n)
            row.append(f"{p['ns_per_call']['median']:,.0f}")
        row.append(f"{misses[int(v)]:,.0f}" if int(v) in misses else "-")
        t.add_row(*row)
    out.print(t)
    out.print(f"D1 misses from {r['miss_source']} ({r['miss_source_note']})")
    if "miss_ratio_1_over_3" in r:
        out.print(f"variant 1 / variant 3 D1 misses: x{r['miss_ratio_1_over_3']:.1f}; fastest: variant {r['fastest_at_largest_n']}")


def storage_table(r: dict) -> None:
    out = console()
    for fs, why in r["fs_skipped"].items():
        out.print(f"[dim]{fs}: skipped: {why}[/]")
    t = Table(title=f"object stores ({r['capacity_mb']} MiB cache, PolyMix-3 mix; medians of {r['reps']})",
              title_justify="left")
    for col in ("fs", "atime", "store", "engine", "fill obj/s", "steady obj/s", "hit ratio", "steady p99 us",
                "syscalls/obj fill", "syscalls/obj steady", "cpu us/obj steady", "fill / fio", "steady / fio"):
        t.add_column(col, justify="right" if "/" in col or "ratio" in col or "p99" in col else "left")
    fmt = lambda v, f="{:,.0f}": "-" if v is None else f.format(v)
    for c in r["combos"]:
        if not c["available"]:
            t.add_row(c["fs"], c["atime"], c["store"], c["engine"], "[dim]unavailable (below)[/]", *[""] * 8)
            continue
        t.add_row(c["fs"], c["atime"], c["store"], c["engine"], fmt(c["fill_objects_per_s"]),
                  fmt(c["steady_objects_per_s"]), fmt(c["steady_hit_ratio"], "{:.2f}"),
                  fmt((c["steady_latency_us"] or {}).get("p99")), fmt(c["fill_syscalls_per_object"], "{:.2f}"),
                  fmt(c["steady_syscalls_per_object"], "{:.2f}"), fmt(c["steady_cpu_us_per_object"], "{:.1f}"),
                  fio.cell(c, "fill"), fio.cell(c, "steady"))
    out.print(t)
    for why in sorted({f"{c['store']} + {c['engine']}: {c['reason']}" for c in r["combos"] if not c["available"]}):
        out.print(f"[dim]unavailable: {why}[/]")
    for k, v in r["fill_ratio_largefile_over_ufs"].items():
        out.print(f"fill, largefile / ufs on {k}: x{v:.1f}")
    for k, v in r["noatime_effect"].items():
        out.print(f"hits alone on {k}: relatime {v['relatime_hit_objects_per_s']:,.0f} obj/s, "
                  f"{v['relatime_hit_write_ios']} device writes; noatime {v['noatime_hit_objects_per_s']:,.0f} obj/s, "
                  f"{v['noatime_hit_write_ios']} device writes")
    for f in r["fio"]:
        out.print(f"fio {f['name']} ({f.get('target')}): " + (f"{f['mb_per_s']:,.1f} MB/s" if f.get("available")
                                                             else f"unavailable: {f.get('reason')}"))
    out.print(f"syscalls counted by: {r['syscall_counting']}")


def proxy_table(r: dict) -> None:
    out = console()
    p = r["plan"]
    names = ", ".join(sorted({s.get("proxy", "squid") for s in r["stores"]}))
    t = Table(title=f"bench proxy: {names}, {p['concurrency']} wrk connections + {p['idle']} idle, "
                    f"{p['steady_s']} s steady after {p['fill_s']} s fill", title_justify="left")
    from proxytune.reports.tables import PROXY_HEADERS, proxy_rows
    for col in PROXY_HEADERS:
        t.add_column(col, justify="left" if col in ("run", "store") else "right")
    labels, rows = proxy_rows(r)
    for row in rows:
        t.add_row(*map(str, row))
    out.print(t)
    for label, s in zip(labels, r["stores"]):
        e = s["errors"]
        kinds = {**{f"wrk {k}": v for k, v in e["wrk_socket"].items() if v and k != "status"},
                 "http errors": e["http_status"], **{f"squid {k}": v for k, v in e["squid_codes"].items()},
                 **{f"idle {k}": v for k, v in e["idle_clients_failed"].items()},
                 "idle dropped": e["idle_clients_dropped"], "fd warnings in cache.log": e["fd_warnings_in_cache_log"]}
        kinds = {k: v for k, v in kinds.items() if v}
        if kinds:
            out.print(f"{label or s.get('proxy', 'squid')} {s['store']} errors: " + ", ".join(f"{k} {v:,}" for k, v in kinds.items()))
    if len(r["stores"]) > 2 and not r.get("compare_profile"):
        from .storequestion import verdict_rows
        v = Table(title="what each store's design predicts", title_justify="left")
        for col in ("prediction", "run", "against", "verdict"):
            v.add_column(col)
        for row in verdict_rows(r["stores"]):
            v.add_row(row[0], row[2], row[3], row[4])
        out.print(v)
    if r.get("compare_profile"):
        n = r["service_nofile"]
        out.print(f"profile {r['compare_profile']}: {r.get('proxy', 'squid')} nofile {n['before']} -> {n['after']}"
                  + (f" (capped at this host's hard limit {n['hard_limit_here']})" if n["capped"] else "")
                  + f"; {len(r['applied'])} step(s) applied, rolled back: {r['rolled_back']}")

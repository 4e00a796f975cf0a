"""Terminal rendering of probe results (rich); JSON goes through the CLI's emitter."""

import json

from rich.table import Table

from proxytune.core.console import console, term_text
from proxytune.core.procfs import comm_of

SEV_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}


def caps_table(c: dict) -> None:
    out = console()
    t = Table(title="probe capabilities", title_justify="left")
    for col in ("capability", "ok", "detail"):
        t.add_column(col)
    for name, v in c["capabilities"].items():
        t.add_row(name, "[green]yes[/]" if v["ok"] else "[red]no[/]", term_text(v["detail"]))
    out.print(t)
    t = Table(title="bpftrace catalog (probes/*.bt)", title_justify="left")
    for col in ("script", "ok", "tracepoints", "purpose"):
        t.add_column(col)
    for name, s in c["scripts"].items():
        verdict = ("[green]yes[/]" if s["ok"] else
                   "[yellow]unknown[/] (tracefs unreadable)" if not s.get("checked", True) else
                   f"[red]no[/] {term_text(', '.join(s['missing']))}")
        t.add_row(term_text(name), verdict, term_text(", ".join(s["tracepoints"])), term_text(s["purpose"]))
    out.print(t)


def _short(v) -> str:
    s = json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v)
    return term_text(s if len(s) <= 160 else s[:157] + "...")


def watching(pids: list[int]) -> str:
    """The progress bar's label (rich markup): the target's name escaped, as anyone can name a process `[/]`."""
    return f"{term_text(comm_of(pids[0]))} ({len(pids)} pid(s))"


def doctor_report(r: dict) -> None:
    out = console()
    ev = r["evidence"]
    pids = ", ".join(map(str, r["target"]["pids"]))
    out.print(f"[bold]doctor[/]: {term_text(r['target']['comm'])} (pids {pids}), "
              f"{r['window_s']:.1f} s window; probes: {term_text(', '.join(ev['scripts']))}"
              + ("; perf: cpu-clock sampling" if ev["perf"].get("available") else
                 f"; perf: {term_text(ev['perf'].get('reason'))}"))
    if ev.get("proxy"):
        px = ev["proxy"]
        st = px.get("stats_after") or {}
        conf = str(px["config"]) + (f" (not read: {px['config_unread']})" if px.get("config_unread") else "")
        out.print(f"proxy: {term_text(px['kind'])} ({term_text(px['exe'])}), config {term_text(conf)}; "
                  "statistics: "
                  + term_text(st.get("source") if st.get("available") else f"none ({st.get('reason')})"))
    for name, why in ev["skipped_scripts"].items():
        out.print(f"[dim]skipped {term_text(name)}: {term_text(why)}[/]")
    for pid, at in r["target"].get("exited", {}).items():
        out.print(f"[yellow]pid {pid} exited {at:g} s into the window[/]: its figures end there")
    if not r["findings"]:
        out.print("[green]no findings[/]: nothing in this window crossed a rule's threshold")
    for i, f in enumerate(r["findings"], 1):
        out.print(f"\n{i}. [{SEV_STYLE[f['severity']]}]{f['severity']}[/] [bold]{term_text(f['id'])}[/]: "
                  + term_text(f["title"]))
        for k, v in f["evidence"].items():
            if v not in (None, {}, []):
                out.print(f"     {term_text(k)}: {_short(v)}")
        out.print(f"   [green]fix[/]: {term_text(f['fix'])}")
    loop = ev["loop"]
    out.print("\n[bold]event loop[/]: " + term_text(
        f"{loop['waits_per_s']} waits/s, {loop['events_per_s']} events/s ({loop['events_per_wait']} per wait), "
        f"{loop['accepts_per_s']} accepts/s, {loop['cpu_cores']} CPUs, {loop['cpu_us_per_event']} us CPU per event"))
    if loop.get("cpu_split"):
        out.print("cpu split: " + ", ".join(f"{k} {v:.0%}" for k, v in sorted(loop["cpu_split"].items(),
                                                                              key=lambda kv: -kv[1])))
    a = ev["audit"]
    if a.get("available"):
        out.print(f"\n[bold]host audit[/] ({term_text(a['profile'])}): {len(a['drift'])} setting(s) drift")
        for d in a["drift"]:
            out.print("  " + term_text(f"{d['setting']}: {d['current']} -> {d['wanted']}"))
    else:
        out.print(f"\n[dim]host audit: {term_text(a.get('reason'))}[/]")


def probe_maps(name: str, maps: dict) -> None:
    out = console()
    out.print(f"[bold]{term_text(name)}[/] ({maps.get('_window_s', 0):.1f} s)")
    for k, v in maps.items():
        if k.startswith("_"):
            continue
        if isinstance(v, list):         # a histogram
            out.print(f"{term_text(k)}:")
            peak = max((b["count"] for b in v), default=0) or 1
            for b in v:
                out.print(f"  [{b.get('min', 0)}, {b.get('max', 0)}]".ljust(28) + f"{b['count']:>10}  "
                          + "#" * int(40 * b["count"] / peak))
        else:
            out.print(f"{term_text(k)}: {_short(v)}")


def cachemiss_report(r: dict) -> None:
    out = console()
    out.print(f"D1 misses: {r['d1_misses']:,} for {r['instructions'] or 0:,} instructions ({term_text(r['source'])})")
    t = Table(title="functions by D1 misses", title_justify="left")
    for col in ("function", "D1 misses", "share", "instructions"):
        t.add_column(col, justify="left" if col == "function" else "right")
    for f in r["functions"]:
        t.add_row(term_text(f["function"]), f"{f['d1_misses']:,}", f"{f['share']:.1%}", f"{f['instructions']:,}")
    out.print(t)

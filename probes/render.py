"""Terminal rendering of probe results (rich); JSON goes through the CLI's emitter."""

import contextlib
import json
from fnmatch import fnmatchcase

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from proxytune.core import monitoring
from proxytune.core.console import console, term_text
from proxytune.core.procfs import comm_of

from .target import shown

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


@contextlib.contextmanager
def watching_bar(pids: list[int], duration: float, quiet: bool):
    """The doctor's window as a progress bar on the terminal (transient: gone when it ends).
    Yields tick(seconds) for diagnose; None when quiet (stdout carries JSON or a monitoring format)."""
    if quiet:
        yield None
        return
    with Progress(TextColumn("watching {task.description}"), BarColumn(), TimeRemainingColumn(),
                  console=console(), transient=True) as bar:
        task = bar.add_task(watching(pids), total=duration)
        yield lambda t: bar.update(task, completed=t)


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
    left = {n: v["why"] for n, v in ((ev.get("triage") or {}).get("need") or {}).items() if n not in ev["scripts"]}
    if left:
        out.print("[dim]not attached (their syscall tracepoints would slow every syscall; --deep attaches them): "
                  + term_text("; ".join(f"{n}: {why}" for n, why in left.items())) + "[/]")
    for pid, at in r["target"].get("exited", {}).items():
        out.print(f"[yellow]pid {pid} exited {at:g} s into the window[/]: its figures end there")
    if r.get("verdict") == "no limit found":
        out.print("[green]no limit found[/]: no cap of the proxy and no kernel limit held it back in this window"
                  + ("" if not r["findings"] else " (only low findings below)"))
        headroom(out, r.get("headroom") or [])
        time_budget(out, r.get("budget"))
    elif not r["findings"]:
        out.print("[green]no findings[/]: nothing in this window crossed a rule's threshold")
    for i, f in enumerate(r["findings"], 1):
        out.print(f"\n{i}. [{SEV_STYLE[f['severity']]}]{f['severity']}[/] [bold]{term_text(f['id'])}[/]: "
                  + term_text(f["title"]))
        for k, v in f["evidence"].items():
            if v not in (None, {}, []):
                out.print(f"     {term_text(k)}: {_short(v)}")
        out.print(f"   [green]fix[/]: {term_text(f['fix'])}")
    if r.get("verdict") != "no limit found":
        time_budget(out, r.get("budget"))
    if ev.get("kernel"):
        out.print("\n[bold]kernel[/]: " + term_text(kernel_headroom(ev["kernel"])))
    loop = ev["loop"]
    if "epoll_events" in ev["scripts"] or loop["waits_per_s"]:
        out.print("\n[bold]event loop[/]: " + term_text(
            f"{loop['waits_per_s']} waits/s, {loop['events_per_s']} events/s ({loop['events_per_wait']} per wait), "
            + _accepts(loop) + f"{loop['cpu_cores']} CPUs, {loop['cpu_us_per_event']} us CPU per event"))
    else:
        out.print("\n[bold]event loop[/]: " + term_text(
            _accepts(loop) + f"{loop['cpu_cores']} CPUs (epoll waits are traced with --deep)"))
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


def headroom(out, rows: list[dict]) -> None:
    """One line per cap and kernel resource: used of limit."""
    if rows:
        out.print("[bold]headroom[/] (peak in the window, of the limit):")
    for h in rows:
        share = f" ({h['share']:.0%})" if h.get("share") is not None else ""
        stops = f", stops at {h['stops_at']}" if h.get("stops_at") not in (None, h.get("limit")) else ""
        out.print("  " + term_text(f"{h['what']}: {h['used']} of {h['limit']}{share}{stops}; {h['where']}"))


def time_budget(out, b: dict | None) -> None:
    """Where an average request's time went in the window, part by part (budget.rows)."""
    if not b:
        return
    from . import budget
    out.print("\n[bold]time budget[/]: " + term_text(budget.headline(b)))
    width = max(len(budget.LABELS[n]) for n in budget.PARTS)
    for part, ms, share, how in budget.rows(b):
        figure = f"{ms:>9} ms {share:>4}" if share else f"{ms}"
        out.print("  " + term_text(f"{part:<{width}}  {figure}  {how}"))


def kernel_headroom(k: dict) -> str:
    """The namespace's kernel resources against their caps, also when no rule fired (silence is not an answer)."""
    s, ss, ct = k.get("sysctl") or {}, k.get("sockstat") or {}, k.get("conntrack") or {}
    parts = []
    if s.get("net.ipv4.tcp_max_tw_buckets") is not None and ss.get("tw") is not None:
        parts.append(f"TIME_WAIT {ss['tw']} of {s['net.ipv4.tcp_max_tw_buckets']} buckets")
    parts.append(f"conntrack {ct['count']} of {ct['max']} entries" if ct.get("available")
                 else f"conntrack unavailable ({ct.get('reason')})")
    mem = s.get("net.ipv4.tcp_mem")
    if isinstance(mem, list) and len(mem) == 3 and ss.get("mem") is not None:
        parts.append(f"TCP memory {ss['mem']} pages (pressure above {mem[1]}, max {mem[2]}; host-wide)")
    if s.get("net.ipv4.tcp_max_orphans") is not None and ss.get("orphan") is not None:
        parts.append(f"orphans {ss['orphan']} of {s['net.ipv4.tcp_max_orphans']} (host-wide)")
    if k.get("sysctl_error"):
        parts.append(f"the target's sysctls not read: {k['sysctl_error']}")
    return ", ".join(parts)


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


def doctor_critical(finding: dict, patterns=()) -> bool:
    """A finding is CRITICAL for monitoring when it is of high severity or its id matches --critical."""
    return finding["severity"] == "high" or any(fnmatchcase(finding["id"], p) for p in patterns)


def doctor_nagios(r: dict, critical=()) -> tuple[int, str]:
    """(state, plugin line) of a doctor run: CRITICAL for a critical finding, WARNING for any other, else OK."""
    found = r["findings"]
    crit = [f for f in found if doctor_critical(f, critical)]
    state = monitoring.CRITICAL if crit else monitoring.WARNING if found else monitoring.OK
    audit = r["evidence"]["audit"]
    drift = len(audit["drift"]) if audit.get("available") else 0
    what = (f"{len(found)} finding(s): " + ", ".join(f"{f['severity']} {f['id']}" for f in found) if found
            else f"no findings in a {r['window_s']:.1f} s window")
    text = f"doctor {shown(r['target']['comm'])} (pids {', '.join(map(str, r['target']['pids']))}): {what}"
    by_sev = {sev: sum(1 for f in found if f["severity"] == sev) for sev in SEV_STYLE}
    perfdata = [monitoring.perf("findings", len(found), "0"), monitoring.perf("critical", len(crit), crit="0"),
                *(monitoring.perf(sev, n) for sev, n in by_sev.items()), monitoring.perf("drift", drift)]
    return state, monitoring.plugin_line(state, text, perfdata)


def doctor_prometheus(r: dict, profile: str) -> str:
    """A doctor run as a node_exporter textfile: each finding by id and severity, and when this ran."""
    m = monitoring.Metrics()
    m.declare("proxytune_doctor_findings", "Findings of the last doctor run, by id and severity (1 each).")
    counts: dict[tuple[str, str], int] = {}
    for f in r["findings"]:
        counts[f["id"], f["severity"]] = counts.get((f["id"], f["severity"]), 0) + 1
    for (fid, sev), n in counts.items():
        m.add("proxytune_doctor_findings", "", {"id": fid, "severity": sev}, n)
    m.add("proxytune_doctor_window_seconds", "Length of the doctor's observation window.", {}, r["window_s"])
    m.declare("proxytune_doctor_request_seconds", "Time an average request spent in each part of its budget in the "
                                                  "window (parts not measurable here are left out).")
    for part, p in ((r.get("budget") or {}).get("parts") or {}).items():
        if p.get("measurable") and p.get("ms") is not None:
            m.add("proxytune_doctor_request_seconds", "", {"part": part}, round(p["ms"] / 1000, 6))
    monitoring.last_run(m, "doctor", profile)
    return m.text()


def _accepts(loop: dict) -> str:
    """Accepts per second when fd_errors.bt counted them (it runs near the fd limit, or with --deep)."""
    return "" if loop.get("accepts_per_s") is None else f"{loop['accepts_per_s']} accepts/s, "


def hotspots_lines(r: dict, pids: list[int]) -> list[str]:
    """`probe hotspots`: the sample count and the proxy / kernel / library split, then the top
    functions by self time (a function or DSO name is the target's text: shown inert)."""
    lines = [f"{r['samples']} samples of pids {pids} at {r['hz']} Hz; split: "
             + ", ".join(f"{k} {v:.0%}" for k, v in r["split"].items())]
    for t in r["top"]:
        where = term_text(f"{t['function']}  ({t['dso']}, {t['where']})", markup=False)
        lines.append(f"  {t['share']:6.1%}  {where}")
    return lines


def overhead_lines(d: dict, component: str) -> list[str]:
    """`probe overhead`: what the component costs nginx per request (from the wrk pairs, or from
    the CPU it adds per syscall and per context switch with --mechanisms), then each BPF
    program's own cost."""
    if "mechanisms" in d:
        u, m, per = d["mechanisms"]["units"], d["mechanisms"]["model"], d["mechanisms"]["nginx_per_request"]
        head = (f"{component} adds {u['syscall']['added_ns']:+.1f} ns of CPU per syscall and "
                f"{u['context_switch']['added_ns']:+.0f} ns per context switch; with nginx's "
                f"{per['syscall']:.2f} syscalls and {per['context_switch']:.3f} switches per request: "
                f"{m['overhead']:+.2%} per request (CI {m['overhead_ci'][0]:+.2%} to {m['overhead_ci'][1]:+.2%})")
        head = [head] + [f"  and {u[unit]['added_ns']:+.0f} ns per {what}, with {per.get(unit) or 0:.4f} {count} per request"
                         for unit, what, count in (("tcp_exchange", "TCP round trip", "segments read"),
                                                   ("connection", "TCP connection opened and closed",
                                                    "connections accepted")) if unit in u]
    else:
        head = (f"nginx CPU per request: {d['off_us_per_request']['median']:.2f} us without {component}, "
                f"{d['on_us_per_request']['median']:.2f} us with it: overhead {d['overhead']:+.1%} "
                f"({d['overhead_ci_confidence']:.1%} CI: {d['verdict']}) "
                f"(pairs: {', '.join(f'{x:+.1%}' for x in d['overhead_per_pair'])}); "
                f"throughput {d['rps_off']:,.0f} -> {d['rps_on']:,.0f} req/s")
    return ([head] if isinstance(head, str) else head) + program_cost_lines(d.get("programs") or {})


def program_cost_lines(p: dict) -> list[str]:
    """What each BPF program's body costs per run and how often it ran, under the same load."""
    if not p.get("available"):
        return [f"BPF programs' own cost: unavailable ({p.get('reason', 'not measured')})"]
    lines = [f"BPF programs under the same load, {p['seconds']:.1f} s with kernel.bpf_stats_enabled "
             "(program bodies only; the tracepoint's and the syscall slow path's cost are not in them):"]
    for r in p["programs"]:
        ns = f"{r['ns_per_run']:8.0f} ns/run" if r["ns_per_run"] is not None else "      never ran"
        lines.append(f"  {r['attached']:<36} {ns} {r['runs_per_s']:12,.0f} runs/s {r['cpu_ns_per_s'] / 1e3:9.1f} us/s")
    return lines

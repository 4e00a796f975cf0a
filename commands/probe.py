"""`proxytune probe`: one bpftrace or perf question each (what the doctor runs together), and
what the doctor costs."""

import sys
from pathlib import Path

import click

from proxytune.core import console
from proxytune.core.errors import ProxytuneError
from proxytune.core.invocation import require_root
from proxytune.probes.target import duration_option

from .options import complete_probes, target_options
from .output import emit_result, finish_bench


@click.group()
def probe():
    """bpftrace and perf probes, one question each (what `doctor` runs together).

    \b
    Examples:
      proxytune probe caps                      what this host lets us observe
      proxytune probe list                      the bpftrace catalog
      proxytune probe run pollscan --pid PID    one script for a window
      proxytune probe hotspots --pid PID        where the CPU goes (perf cpu-clock)
      proxytune probe cachemiss -- CMD ARGS     D1 misses by function (counters or cachegrind)
    """


@probe.command("caps")
@click.option("--json", "as_json", is_flag=True, help="Print the capabilities as JSON.")
def probe_caps(as_json):
    """Root, tracefs (mounted when root), bpftrace, each tracepoint the catalog
    uses, kprobes (tried, not assumed), BTF, perf sampling, hardware counters,
    valgrind, container and pid namespace. Exit 1 if something is missing.

    \b
    Examples:
      proxytune probe caps
      proxytune probe caps --json
    """
    from proxytune.probes import caps, render as prender
    c = caps.check()
    if as_json:
        emit_result("probe", {"probe": "caps", **c})
    else:
        prender.caps_table(c)
    sys.exit(0 if caps.all_available(c) else 1)


@probe.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the catalog as JSON.")
def probe_list(as_json):
    """The bpftrace scripts in probes/, each runnable standalone: bpftrace probes/NAME.bt PID.

    \b
    Examples:
      proxytune probe list
    """
    from proxytune.probes import bpftrace
    scripts = bpftrace.listing()
    if as_json:
        emit_result("probe", {"probe": "list", "scripts": scripts})
        return
    console.print_rows("bpftrace catalog", ["name", "purpose", "tracepoints"],
                       [[s["name"], s["purpose"], ", ".join(s["tracepoints"])] for s in scripts])


@probe.command("run")
@click.argument("name", shell_complete=complete_probes)
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print the maps as JSON.")
def probe_run(name, pid, comm, duration, as_json):
    """Run one catalog script against a process for a window and print its maps.

    \b
    Examples (as root):
      proxytune probe run pollscan --comm squid
      proxytune probe run syscall_mix --pid 1234 --duration 5 --json
    """
    from proxytune.probes import bpftrace, caps, doctor, proc, render as prender
    script = bpftrace.named(name)
    pids = proc.resolve(pid, comm)
    caps.require_script(script)
    maps = bpftrace.run_for([script], pids, duration, doctor.script_args(pids))
    if as_json:
        emit_result("probe", {"probe": name, "pids": pids, **maps})
    else:
        prender.probe_maps(name, maps)


@probe.command("hotspots")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print the samples as JSON.")
def probe_hotspots(pid, comm, duration, as_json):
    """Where the target's CPU goes: perf record -e cpu-clock -a, filtered by
    pid; functions by self time, and the proxy / kernel / shared-library split.

    \b
    Examples (as root):
      proxytune probe hotspots --comm nginx --duration 20
    """
    from proxytune.probes import perf, proc, render as prender
    pids = proc.resolve(pid, comm)
    r = perf.sample_cpu(pids, duration)
    if as_json:
        emit_result("probe", {"probe": "hotspots", "pids": pids, **r})
        return
    if not r.get("available"):
        raise ProxytuneError(r["reason"])
    click.echo("\n".join(prender.hotspots_lines(r, pids)))


@probe.command("cachemiss", context_settings={"ignore_unknown_options": True})
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--json", "as_json", is_flag=True, help="Print the misses as JSON.")
def probe_cachemiss(command, as_json):
    """D1 cache misses of a reproduction command, by function: hardware
    counters when the machine has them (totals only), else cachegrind with a
    32 KiB/8-way/64 B D1 (per function).

    \b
    Examples:
      proxytune probe cachemiss -- ./server --idle 5000
    """
    from proxytune.probes import perf, render as prender
    r = perf.cache_misses(list(command))
    if as_json:
        emit_result("probe", {"probe": "cachemiss", "command": list(command), **r})
    else:
        prender.cachemiss_report(r)


@probe.command("overhead")
@click.option("--seconds", default="10", show_default=True, callback=duration_option,
              help="Length of each wrk run, seconds.")
@click.option("--reps", type=click.IntRange(1, 30), default=6, show_default=True,
              help="Pairs of runs (off, on) during which no other user's tracer ran; up to 3x as many are tried. "
                   "5 or more give a verdict; longer runs shrink each pair's noise (--seconds 30 --reps 10).")
@click.option("--connections", type=click.IntRange(1, 5000), default=50, show_default=True, help="wrk connections.")
@click.option("--component", default="doctor", show_default=True, metavar="NAME",
              help="What to attach in the 'on' runs: doctor, bpftrace (no perf), perf, perf-nocg, one .bt script "
                   "by name, or none (an A/A control: the noise floor).")
@click.option("--pace-ms", type=click.IntRange(0, 1000), default=1, show_default=True,
              help="Each wrk connection waits this long between requests, so nginx runs below saturation at a "
                   "steady rate; 0 = as fast as wrk goes.")
@click.option("--mechanisms", is_flag=True,
              help="Instead of wrk pairs, measure the CPU the component adds per syscall and per context switch "
                   "(CPU time: low noise), and model the cost per request from nginx's syscalls and switches "
                   "per request.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Result JSON file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result JSON.")
def probe_overhead(seconds, reps, connections, component, pace_ms, mechanisms, output, as_json):
    """What the doctor costs: nginx's CPU per request under wrk, with and
    without the doctor attached, alternating. Needs root, nginx and wrk.

    \b
    Examples (as root):
      proxytune probe overhead --seconds 30 --reps 10
      proxytune probe overhead --component none     the A/A control: the noise floor
      proxytune probe overhead --mechanisms
    """
    from proxytune.microbench.runner import progress
    from proxytune.probes import overhead, render as prender
    require_root("it attaches bpftrace and perf -a")
    overhead.check_component(component)
    with progress(as_json) as bar:
        task = bar.add_task(f"nginx under wrk, {component} off/on pairs", total=reps)
        data = overhead.measure(seconds, reps, connections, progress=lambda: bar.advance(task), component=component,
                                pace_ms=pace_ms, mechanisms=mechanisms)
    finish_bench(data, "doctor-overhead", output, as_json,
                 show=lambda d: click.echo("\n".join(prender.overhead_lines(d, component))))

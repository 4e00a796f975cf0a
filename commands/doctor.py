"""`proxytune doctor`: diagnose a running proxy, what limits it, with evidence and a fix."""

import sys

import click

from proxytune.core.invocation import require_root

from .options import (DEFAULT_PROFILE, MONITOR_FORMATS, complete_profiles, monitor_options, refuse_monitor_misuse,
                      target_options)
from .output import emit_json, emit_metrics


@click.command()
@target_options
@click.option("--profile", "-p", "profile_ref", default=DEFAULT_PROFILE, show_default=True, metavar="NAME|PATH", shell_complete=complete_profiles,
              help="Profile for the host audit.")
@click.option("--cache-dir", "cache_dirs", multiple=True, metavar="DIR",
              help="The proxy's cache directory (repeatable) [from squid -f CONF].")
@click.option("--deep", is_flag=True, help="Also every syscall script (poll, fds, connect errno, opens by path, fsync), "
              "epoll waits and events, block-I/O and run-queue latency: slows every syscall on the host (~2 %).")
@click.option("--no-perf", is_flag=True, help="No CPU sampling.")
@monitor_options
@click.option("--json", "as_json", is_flag=True, help='Print {"findings": [{"id", "severity", "evidence", "fix"}...]}.')
@click.pass_obj
def doctor(host, pid, comm, duration, profile_ref, cache_dirs, deep, no_perf, fmt, critical, output, as_json):
    """Diagnose a running proxy: what limits it, with evidence and a fix.

    \b
    Audits the host (tune check), then watches the process for a bounded
    window (default 10 s) with one bpftrace program on syscall and sched
    tracepoints (filtered by pid, aggregated in the kernel) and perf
    cpu-clock sampling, plus TcpExt counters and /proc. Findings:
      fd-exhaustion, low-nofile-limit, accept-queue-overflow,
      other-listener-overflow (low: another listener of its namespace
      dropped), syn-backlog-overflow, ephemeral-port-exhaustion, poll-scan,
      blocking-disk-io, file-per-object-churn, cache-dir-atime, cpu-hotspot,
      time-wait-overflow, conntrack-full, tcp-memory-pressure,
      orphan-sockets, listen-drops (the kernel's tables and counters in the
      target's network namespace),
      and the proxy's own caps: haproxy-maxconn, varnish-thread-pool,
      nginx-worker-connections, squid-fd-limit,
      trafficserver-connections-throttle (read from its config and stats),
      and from the time budget (where an average request's time goes:
      accept queue, queue in the proxy, connect, origin's first byte, the
      proxy itself): slow-origin, proxy-queue, accept-wait, proxy-cpu,
      loop-lag
    ranked by severity and impact. Read-only; needs root.
    Exit 0 no findings, 1 findings, 2 error (with --format nagios: 0 OK,
    1 WARNING, 2 CRITICAL: a high-severity finding or one --critical names,
    3 UNKNOWN).

    \b
    Examples (as root):
      proxytune doctor --comm squid
      proxytune doctor --pid 1234 --duration 5 --json
      proxytune doctor --comm nginx --format nagios --critical 'nginx-*'
    """
    refuse_monitor_misuse(fmt, critical, output)
    from proxytune.probes import doctor as doctor_mod, proc, render as prender
    from proxytune.reports.schema import envelope
    pids = proc.resolve(pid, comm)
    require_root("it attaches bpftrace and perf -a")
    with prender.watching_bar(pids, duration, quiet=as_json or fmt in MONITOR_FORMATS) as tick:
        r = doctor_mod.diagnose(pids, duration, host=host, profile_ref=profile_ref, cache_dirs=list(cache_dirs),
                                deep=deep, use_perf=not no_perf, tick=tick)
    if fmt == "nagios":
        state, line = prender.doctor_nagios(r, critical)
        click.echo(line)
        sys.exit(state)
    if fmt == "prometheus":
        emit_metrics(prender.doctor_prometheus(r, profile_ref), output)
    elif as_json:
        doc = envelope("probe", {"probe": "doctor", **r})
        doc["findings"] = r["findings"]
        emit_json(doc)
    else:
        prender.doctor_report(r)
    sys.exit(1 if r["findings"] else 0)

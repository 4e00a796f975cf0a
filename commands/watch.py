"""`proxytune watch`: the doctor always on, as a flight recorder; `watch history` and `watch show`."""

import contextlib
import math
import os
import re
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import click

from proxytune.core import signals
from proxytune.core.errors import ProxytuneError, one_line
from proxytune.core.invocation import require_root
from proxytune.probes.target import duration_option

from .options import DEFAULT_PROFILE, complete_profiles
from .output import emit_json, emit_metrics, emit_result

RING = "watch"
_SIZE = re.compile(r"(\d+)\s*([KMG]?)i?B?", re.I)
_AGO = re.compile(r"(\d{1,9})\s*([smhd])", re.I)      # 999,999,999 days back at most: beyond it is no time


def ring_dir(host) -> Path:
    """STATE_DIR/watch, absolute (the safe file layer walks it from /)."""
    return Path(os.path.abspath(host.state_dir)) / RING


def parse_size(ctx, param, value) -> int:
    """'256M', '1G', '65536': bytes (K, M, G are powers of 1024)."""
    m = _SIZE.fullmatch(str(value).strip())
    if not m:
        raise click.BadParameter(f"{value!r} is no size (e.g. 256M, 1G)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def window_s(value) -> float:
    """A window of at least a second: bpftrace dumps its maps every window (an interval in whole ms),
    and what a window reads costs the same however short it is."""
    try:
        s = duration_option(None, None, value)
    except ProxytuneError:
        raise click.BadParameter(f"{value!r} is no length in seconds (1 or more)") from None
    if s < 1.0:
        raise click.BadParameter(f"a window is at least 1 second, not {s:g}")
    return s


def finite_minutes(ctx, param, value: float) -> float:
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is no number of minutes")
    return value


def parse_time(ctx, param, value) -> float | None:
    """An ISO time (UTC unless it says otherwise: 2026-11-26T03:12, '2026-11-26 03:12:00+01:00'), an
    epoch second, or an age: 90m, 2h, 1d (ago)."""
    if value is None:
        return None
    text = value.strip()
    if m := _AGO.fullmatch(text):
        return max(0.0, time.time() - int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2).lower()])
    if re.fullmatch(r"\d{9,11}(\.\d+)?", text):
        return float(text)
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is no time: give 2026-11-26T03:12 (UTC), an epoch second, "
                                 "or an age like 2h") from None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


@click.group(invoke_without_command=True)
@click.option("--pid", type=int, metavar="PID", help="Watch this proxy master (followed when it restarts).")
@click.option("--unit", metavar="NAME", help="Watch this proxy service (e.g. haproxy, nginx, squid).")
@click.option("--window", "-w", default="10", show_default=True, metavar="S", callback=lambda c, p, v: window_s(v),
              help="Length of each window, seconds (1 or more).")
@click.option("--max-size", default="256M", show_default=True, metavar="SIZE", callback=parse_size,
              help="Cap of the recorder on disk (STATE_DIR/watch); the oldest windows go first.")
@click.option("--profile", "-p", "profile_ref", default=DEFAULT_PROFILE, show_default=True, metavar="NAME|PATH",
              shell_complete=complete_profiles, help="Profile for each window's host audit.")
@click.option("--no-perf", is_flag=True, help="No CPU sampling (without it, perf samples a window only after one "
              "in which the proxy used 0.2 of a core or more: below that no CPU rule can fire).")
@click.option("--listen", metavar="[IP:]PORT", help="Serve the metrics at http://IP:PORT/metrics for Prometheus "
              "(IP 127.0.0.1 unless given).")
@click.option("--textfile", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the metrics to FILE after each window, for node_exporter's textfile collector "
                   "(e.g. /var/lib/prometheus/node-exporter/proxytune-watch.prom).")
@click.pass_context
def watch(ctx, pid, unit, window, max_size, profile_ref, no_perf, listen, textfile):
    """Watch a proxy continuously: the doctor every window, kept in a flight recorder.

    \b
    Each window (default 10 s) runs the doctor's default probes on the
    detected proxy (or --pid / --unit), follows it through reloads and
    restarts, and waits (saying so) while it is absent. Every window is
    appended to a bounded, crash-safe recorder under the state directory;
    consecutive windows with one finding form an episode, whose start and
    end also go to the system journal (journalctl -t proxytune).
    Runs in the foreground until Ctrl-C (exit 130). Needs root.

    \b
    Examples (as root):
      proxytune watch                        the proxy found running
      proxytune watch --unit haproxy --window 30 --max-size 1G
      proxytune watch history --since 2h     what limited it lately
      proxytune watch show 20261126T031200Z-haproxy-maxconn
    """
    if ctx.invoked_subcommand is not None:
        return
    if pid is not None and unit is not None:
        raise click.UsageError("give --pid or --unit, not both")
    from proxytune.probes import locate, recorder, watch as watch_mod
    host = ctx.obj
    require_root("it attaches bpftrace and perf -a")
    locator = locate.Locator(pid, unit)
    with recorder.Recorder(ring_dir(host), max_size) as ring, _publishers(listen, textfile) as publish:
        loop = watch_mod.Loop(ring, locator, window, say=_say, publish=publish,
                              diagnose_kw={"host": host, "profile_ref": profile_ref, "use_perf": not no_perf})
        _say(f"recording {window:g} s windows into {ring_dir(host)} (at most {max_size >> 20} MiB)")
        try:
            signals.catch((signal.SIGTERM, signal.SIGHUP), _stop)      # `systemctl stop`: the same clean end
            loop.forever()
        except KeyboardInterrupt:
            loop.stopped()
            _say(f"stopped after {loop.seq} window(s)"
                 + (f"; {ring.dropped} could not be stored" if ring.dropped else ""))
            raise


@contextlib.contextmanager
def _publishers(listen: str | None, textfile: str | None):
    """The metrics' consumers, each tried once before the first window, so a port in use or a refused
    directory is one error line (exit 2) and not a watch that silently publishes nothing."""
    from proxytune.probes import metricserver, watchmetrics
    out, endpoint = [], None
    first = watchmetrics.text(None, {"cpu_s": watchmetrics.watcher_cpu_seconds()})
    if textfile:
        path = Path(os.path.abspath(textfile))
        out.append(lambda text: emit_metrics(text, path))
    if listen:
        endpoint = metricserver.Endpoint(*metricserver.parse_listen(listen))
        out.append(endpoint.update)
        _say(f"metrics at http://{endpoint.address}/metrics")
    try:
        for publish in out:
            publish(first)
        yield out
    finally:
        if endpoint is not None:
            endpoint.close()


def _stop(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _say(line: str) -> None:
    """One line to stderr (the journal's under the unit): a finding's title can carry a thread's name,
    which its process chose, so control characters are written as escapes."""
    click.echo(f"{time.strftime('%H:%M:%S')} {one_line(line)}", err=True)


def _episodes(host) -> tuple[list[dict], object]:
    from proxytune.probes import episodes, recorder
    reading = recorder.read(ring_dir(host), whole=False)        # heads only: a full ring is 100k windows
    return episodes.fold(reading.records), reading


@watch.command()
@click.option("--since", callback=parse_time, metavar="TIME", help="Episodes still going at or after TIME "
              "(2026-11-26T03:00 UTC, an epoch second, or an age: 2h).")
@click.option("--until", callback=parse_time, metavar="TIME", help="Episodes that began at or before TIME.")
@click.option("--json", "as_json", is_flag=True, help="Print the episodes as result JSON.")
@click.pass_obj
def history(host, since, until, as_json):
    """The episodes the recorder holds: what limited the proxy, when, how badly.

    Exit 0 when none is in the range, 1 when some are, 2 on error.

    \b
    Examples (as root):
      proxytune watch history                       every episode the recorder holds
      proxytune watch history --since 2h --json
      proxytune watch history --since 2026-11-26T03:00 --until 2026-11-26T04:00
    """
    from proxytune.probes import episodes, windows
    eps, reading = _episodes(host)
    shown = episodes.between(eps, since, until)
    if as_json:
        emit_result("watch", {"recorder": str(ring_dir(host)), "episodes": [episodes.summary(e) for e in shown],
                              "damaged_segments": reading.damaged_segments,
                              "dropped_bytes": reading.dropped_bytes})
    else:
        for line in history_lines(shown, reading, windows.stamp):
            click.echo(line)
    sys.exit(1 if shown else 0)


def history_lines(shown: list[dict], reading, stamp) -> list[str]:
    from proxytune.core.console import term_text
    from proxytune.probes.windows import is_window
    recs = [r for r in reading.records if is_window(r)]      # another version's records are left out
    if not recs:
        return ["no windows recorded yet (run `proxytune watch`)"]
    out = [f"{len(recs)} window(s) recorded, {stamp(recs[0]['t0'])} to "
           f"{stamp(recs[-1]['t1'])}; {len(shown)} episode(s)"]
    if reading.damaged_segments:
        out.append(f"damaged records dropped in {', '.join(reading.damaged_segments)}")
    for e in shown:
        end = "ongoing" if e["ongoing"] else stamp(e["end"])
        out.append(term_text(f"{e['id']}  {e['severity']:<6} {e['finding']}  {stamp(e['start'])} to {end} "
                             f"({e['windows']} window(s)), {e.get('proxy') or e.get('comm') or '?'}: {e['title']}",
                             markup=False))
    return out


@watch.command()
@click.option("--minutes", "-m", default=15.0, show_default=True, type=click.FloatRange(min=0.1, max=7 * 24 * 60),
              callback=finite_minutes,
              help="How far back to look.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "nagios"]), default="text", show_default=True,
              help="text for a terminal, json for automation, nagios for a Nagios/Icinga check.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--critical", multiple=True, metavar="GLOB", help="With --format nagios: finding ids (globs) that are "
              "CRITICAL even at medium severity, e.g. 'haproxy-*'.")
@click.pass_obj
def status(host, minutes, fmt, as_json, critical):
    """What the watcher saw in the last minutes: each finding, absent and failed windows.

    Exit 0 nothing found, 1 findings or an absent proxy, 2 error; with
    --format nagios the plugin states: 0 OK, 1 WARNING, 2 CRITICAL (a
    high-severity finding, or one --critical names), 3 UNKNOWN (no window
    in the span: the watcher is not running, or every window failed).

    \b
    Examples (as root):
      proxytune watch status                          the last 15 minutes
      proxytune watch status --minutes 60 --json
      proxytune watch status --format nagios --critical 'haproxy-*'
    """
    from proxytune.probes import recorder, watchstatus
    now = time.time()
    reading = recorder.read(ring_dir(host), whole=False, since=now - minutes * 60)   # the span's segments only
    s = watchstatus.summarise(reading.records, now - minutes * 60, now)
    if fmt == "nagios":
        state, line = watchstatus.nagios(s, minutes, critical)
        click.echo(line)
        sys.exit(state)
    if fmt == "json" or as_json:
        emit_result("watch-status", {"recorder": str(ring_dir(host)), "minutes": minutes, **s})
    else:
        from proxytune.core.console import term_text
        from proxytune.probes import windows
        st = s["by_status"]
        click.echo(f"last {minutes:g} min: {s['windows']} window(s): {st['watched']} watched, {st['absent']} absent, "
                   f"{st['failed']} failed")
        for f in s["findings"]:
            click.echo(term_text(f"  {f['severity']:<6} {f['id']}  in {f['windows']} window(s), last "
                                 f"{windows.stamp(f['last'])}: {f['title']}", markup=False))
        for why in s["failed_reasons"]:
            click.echo(term_text(f"  failed: {why}", markup=False))
    sys.exit(1 if s["findings"] or s["by_status"]["absent"] else 0)


@watch.command()
@click.argument("ident", metavar="ID")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True,
              help="text for a terminal, json for automation, markdown for a ticket or a report")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json (as every other command says it).")
@click.pass_obj
def show(host, ident, fmt, as_json):
    """Print an episode's worst window as the doctor printed it (ID from `watch history`).

    \b
    Examples (as root):
      proxytune watch show 20261126T031200Z-haproxy-maxconn
      proxytune watch show 20261126T031200Z-haproxy-maxconn --format markdown
    """
    from proxytune.probes import episodes, recorder, render as prender, windows
    eps, _ = _episodes(host)
    ep = episodes.find(eps, ident)
    if ep is None:
        raise ProxytuneError(f"no episode {ident!r} in {ring_dir(host)}", "list them with: proxytune watch history")
    whole = recorder.load(ring_dir(host), ep["worst"]["_at"])
    if whole is None:
        raise ProxytuneError(f"the worst window of episode {ident} is no longer in {ring_dir(host)}",
                             "the ring moved on while it was read; run it again")
    r = windows.as_result(whole)
    if fmt == "json" or as_json:
        from proxytune.reports.schema import envelope
        doc = envelope("probe", {"probe": "doctor", **r})
        doc["findings"], doc["episode"] = r["findings"], episodes.summary(ep)
        emit_json(doc)
    elif fmt == "markdown":
        from proxytune.reports.doctor_md import render
        click.echo(render(r, episodes.summary(ep)))
    else:
        click.echo(f"episode {ep['id']}: {ep['windows']} window(s), {windows.stamp(ep['start'])} to "
                   f"{windows.stamp(ep['end'])}; its worst window:")
        prender.doctor_report(r)

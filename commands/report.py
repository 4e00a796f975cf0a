"""`proxytune report`: audit this host and run the quick benchmarks into one report; put
results side by side; a fleet result as a matrix."""

from pathlib import Path

import click

from proxytune.core.errors import ProxytuneError

from .options import DEFAULT_PROFILE, complete_profiles


@click.group(invoke_without_command=True)
@click.option("--output", "-o", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("proxytune-report"), show_default=True, help="Directory for report.{html,md,json}.")
@click.option("--profile", "-p", "profile_ref", default=DEFAULT_PROFILE, show_default=True, metavar="NAME|PATH", shell_complete=complete_profiles,
              help="Profile for the host audit.")
@click.option("--no-bench", is_flag=True, help="Only the host audit, no benchmarks.")
@click.option("--with-proxy", is_flag=True, help="Also bench proxy --quick (squid ufs/aufs/rock under load, ~2 min) and the doctor on an nginx it starts.")
@click.option("--full", is_flag=True, help="The longer, more precise run of the same sections: every filesystem, "
              "engine and N, more repetitions and rounds (about 30 min here, against about 2 min).")
@click.option("--from", "from_files", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              metavar="FILE", help="Use a saved bench (or report) result instead of running it (repeatable).")
@click.pass_context
def report(ctx, out_dir, profile_ref, no_bench, with_proxy, from_files, full):
    """Audit this host, run the quick benchmarks, write the report.

    \b
    The main job, under a minute on a 2-core VM (--full: the same sections,
    longer and more precise). Sections: the host audit against the profile
    (with the running proxy's limits, backlogs and cache-directory mounts;
    its summary is printed first), the event mechanisms (bench events),
    Mogul's comm_select study (bench fdscan), the object stores (bench
    storage, as root) and, as root, Cooper's host settings: two Squids the
    report starts, each in a private network namespace, one with the fd
    limit and net.* settings Squid's service has, one with the profile's,
    loaded in turn and watched by perf for the CPU split (the doctor's
    probes say where the first one's latency went). Nothing of the host
    changes. Writes report.html (self-contained: figures embedded,
    nothing fetched), report.md with its PNG figures, and report.json.

    \b
    Examples:
      proxytune report                          audit and quick benchmarks, into ./proxytune-report
      proxytune report --full -o /var/tmp/report
      proxytune report --no-bench -p linux/squid -o /tmp/audit
      proxytune report compare A.json B.json    hosts side by side
    """
    if ctx.invoked_subcommand:
        return
    from proxytune.reports import build, summary
    saved = build.saved_benches(list(from_files)) if from_files else None
    paths, doc = build.write_report(ctx.obj, profile_ref, out_dir, benches=not no_bench and not saved,
                                    with_proxy=with_proxy and not (saved and "proxy" in saved), saved=saved,
                                    full=full, on_audit=lambda audit: _echo(summary.audit_lines(audit)))
    _echo(summary.terminal_lines(doc))
    if "plots" in doc["data"]["skipped"]:
        click.echo(f"proxytune: {doc['data']['skipped']['plots']}", err=True)
    for p in paths:
        click.echo(f"wrote {p}")


def _echo(lines: list[str]) -> None:
    for line in lines:
        click.echo(line)


@report.command("compare")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--output", "-o", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("proxytune-compare"), show_default=True, help="Directory for compare.{html,md}.")
def report_compare(files, out_dir):
    """Put results side by side, one column per file: reports, benches,
    audits or doctor results, from several hosts (a FreeBSD and a Linux
    host) or one host before and after tuning.

    \b
    Examples:
      proxytune report compare before/report.json after/report.json -o tuning
    """
    from proxytune.reports import build, compare
    if len(files) < 2:
        raise ProxytuneError("compare needs at least two result files")
    docs = build.load_results(list(files))
    for p in compare.write(docs, list(files), out_dir):
        click.echo(f"wrote {p}")


@report.command("fleet")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--output", "-o", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("proxytune-fleet"), show_default=True, help="Directory for fleet.{html,md}.")
def report_fleet(file, out_dir):
    """A `fleet ... --json` result as a hosts x settings matrix (terminal, Markdown, HTML).

    \b
    Examples:
      proxytune fleet check -i hosts.ini --json > fleet.json
      proxytune report fleet fleet.json -o fleet-report
    """
    from proxytune.reports import fleet as fleet_report
    doc = fleet_report.load(file)
    fleet_report.print_terminal(doc["data"])
    for p in fleet_report.write(doc, out_dir):
        click.echo(f"wrote {p}")

"""Options and shell completions that several command groups share: the profile and its
parameters (every tune command, doctor, report), a monitoring system's output format (check,
doctor), and the process a probe watches (probe, doctor)."""

import platform
from pathlib import Path

import click

from proxytune.core import console
from proxytune.core.errors import ProxytuneError
from proxytune.probes.target import MAX_SECONDS, duration_option
from proxytune.tune import profile as profile_mod


DEFAULT_PROFILE = {"linux": "linux/proxy", "freebsd": "freebsd/proxy"}.get(platform.system().lower(), "linux/proxy")


def complete_profiles(ctx, param, incomplete):
    """Shell completion: profile names (site, user, shipped); a path completes as a file."""
    from click.shell_completion import CompletionItem
    if incomplete.startswith((".", "/", "~")):
        return [CompletionItem(incomplete, type="file")]
    root = Path(ctx.find_root().params.get("root") or "/")
    return [name for name in profile_mod.available(root) if name.startswith(incomplete)]


def complete_probes(ctx, param, incomplete):
    """Shell completion: the bpftrace catalog's probe names."""
    from proxytune.probes import bpftrace
    return [name for name in bpftrace.catalog() if name.startswith(incomplete)]


PROFILE_HELP = ("A profile name from the site, user or shipped catalog (see `profiles list`; never the "
                "current directory), or a file: a path starting with / ./ ../ or ending in .toml, "
                "read only if root or you own it and no one else can write it or a directory above it.")


def profile_options(f):
    """--profile, --only and the parameters, shared by every tune command."""
    options = [
        click.option("--profile", "-p", "profile_ref", default=DEFAULT_PROFILE, show_default=True, shell_complete=complete_profiles,
                     metavar="NAME|PATH", help=PROFILE_HELP),
        click.option("--only", multiple=True, metavar="GLOB",
                     help="Only settings whose backend:key matches, e.g. 'sysctl:net.*' (repeatable)."),
        click.option("--skip", multiple=True, metavar="GLOB",
                     help="Leave out settings whose backend:key matches (repeatable)."),
        click.option("--service", metavar="NAME", help="Proxy service/process name [auto-detected]."),
        click.option("--user", metavar="USER", help="User the proxy runs as [auto-detected]."),
        click.option("--cache-dir", "cache_dirs", multiple=True, metavar="DIR",
                     help="A cache directory (repeatable) [from squid.conf / nginx config]."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def cli_params(service, user, cache_dirs) -> dict:
    return {"service": service, "user": user, "cache_dirs": list(cache_dirs)}


def monitor_options(f):
    """--format (tables, or a monitoring system's format), --critical and -o: check and doctor."""
    options = [
        click.option("--format", "fmt", type=click.Choice(console.FORMATS + MONITOR_FORMATS), is_eager=True,
                     callback=_check_format, help="table or tsv (as the global --format); nagios: one plugin "
                     "status line with perfdata, exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (any error of "
                     "proxytune itself); prometheus: a node_exporter textfile."),
        click.option("--critical", multiple=True, metavar="GLOB",
                     help="With --format nagios: drift of a setting matching this (backend:key) is CRITICAL, "
                          "not WARNING (repeatable; a profile marks one with `critical = true`)."),
        click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
                     help="With --format prometheus: write FILE atomically (temp file + rename, as the "
                          "node_exporter textfile directory needs) [stdout]."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


MONITOR_FORMATS = ("nagios", "prometheus")


def _check_format(ctx, param, value):
    """table and tsv are the global --format's; nagios and prometheus stay with the command."""
    if value in console.FORMATS:
        console.set_format(value)
    return value


def refuse_monitor_misuse(fmt, critical, output) -> None:
    if critical and fmt != "nagios":
        raise ProxytuneError("--critical only changes --format nagios", "add --format nagios")
    if output and fmt != "prometheus":
        raise ProxytuneError("--output is the textfile of --format prometheus", "add --format prometheus")


def target_options(f):
    """--pid, --comm and --duration: the process a probe or the doctor watches, for how long."""
    for opt in reversed([
            click.option("--pid", type=int, metavar="PID", help="The process to probe."),
            click.option("--comm", metavar="NAME", help="Every process with this name (e.g. nginx: master and workers)."),
            click.option("--duration", "-d", default="10", show_default=True, metavar="S", callback=duration_option,
                         help=f"Length of the observation window, seconds (at most {MAX_SECONDS:g}).")]):
        f = opt(f)
    return f

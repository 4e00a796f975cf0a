"""proxytune: tune, diagnose and benchmark web-proxy hosts.

This file only parses options and calls into the packages (tune/, reports/,
...). Exit codes everywhere: 0 all good, 1 drift or findings, 2 usage or
runtime error (also any unexpected exception), 130 interrupted.
"""

import json
import os
import platform
import shutil
import sys
from pathlib import Path

if not __package__:
    # From a checkout (./proxytune, tests), the checkout is the `proxytune`
    # package, as installed: proxytune.tune is ./tune, proxytune.cli this file.
    import importlib.machinery
    import importlib.util
    if "proxytune" not in sys.modules:
        _spec = importlib.machinery.ModuleSpec("proxytune", None, is_package=True)
        _spec.submodule_search_locations = [str(Path(__file__).resolve().parent)]
        sys.modules["proxytune"] = importlib.util.module_from_spec(_spec)

import click

from proxytune.tune import apply as apply_mod, audit as audit_mod, export as export_mod, journal, plan as plan_mod
from proxytune.tune import files as files_mod, profile as profile_mod, render
from proxytune.core import console, monitoring
from proxytune.core.errors import ProxytuneError, one_line
from proxytune.core.invocation import command, needs_root, require_root
from proxytune.tune.host import Host
from proxytune.probes import kinds as proxy_kinds
from proxytune.probes.target import MAX_SECONDS, duration_option

__version__ = "0.1.0"
DEFAULT_PROFILE = {"linux": "linux/proxy", "freebsd": "freebsd/proxy"}.get(platform.system().lower(), "linux/proxy")


class Main(click.Group):
    """Exit codes the README promises, whatever happens below: a ProxytuneError is one line
    and a hint (exit 2, or 130 when interrupted); Ctrl-C is 130; a permission denied to a
    non-root user is one line naming the path; any other exception is a bug, reported as one
    `internal error` line, exit 2 (its traceback only with --debug)."""

    def parse_args(self, ctx, args):
        ctx.meta[NAGIOS] = nagios_requested(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        if ctx.meta.get(NAGIOS):
            return self.invoke_as_plugin(ctx)
        try:
            return super().invoke(ctx)
        except ProxytuneError as e:
            say_error(e.message, e.hint)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("proxytune: interrupted", err=True)
            sys.exit(130)
        except click.exceptions.Abort as e:
            if isinstance(e.__context__, KeyboardInterrupt):      # Ctrl-C at a prompt
                say_error("interrupted; nothing was changed")
                sys.exit(130)
            say_error("not confirmed; nothing was changed")
            sys.exit(2)
        except (click.exceptions.ClickException, click.exceptions.Exit, SystemExit):
            raise
        except Exception as e:
            if ctx.params.get("debug"):
                import traceback
                traceback.print_exc()
            if isinstance(e, PermissionError) and os.geteuid() != 0:    # (root denied is a bug, said below)
                say_error(one_line(f"permission denied: {e.filename or e}"),
                          f"uid {os.geteuid()} may not use it: run it as a user who may, e.g. root: "
                          f"{command(root=True)}")
                sys.exit(2)
            notes = "; ".join(getattr(e, "__notes__", []))
            say_error(f"{type(e).__name__}: {e}{'; ' + notes if notes else ''}".replace("\n", " "),
                      "this is a bug in proxytune; rerun with --debug for the traceback", kind="internal error")
            sys.exit(2)

    def invoke_as_plugin(self, ctx):
        """--format nagios: whatever goes wrong in proxytune itself is UNKNOWN (exit 3) on one
        status line, never CRITICAL: a typo'd profile must not page someone as a host problem."""
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, SystemExit):
            raise
        except BaseException as e:          # Ctrl-C and bugs are UNKNOWN too
            if isinstance(e, ProxytuneError):
                message, hint = e.message, e.hint
            elif isinstance(e, click.exceptions.ClickException):
                message, hint = e.format_message(), None
            elif isinstance(e, (KeyboardInterrupt, click.exceptions.Abort)):
                message, hint = "interrupted", None
            else:
                message, hint = f"internal error: {type(e).__name__}: {e}", "rerun with --debug for the traceback"
                if ctx.params.get("debug"):
                    import traceback
                    traceback.print_exc()
            click.echo(monitoring.unknown_line(message))
            say_error(message, hint)
            sys.exit(monitoring.UNKNOWN)


NAGIOS = "proxytune.nagios"


def nagios_requested(args: list[str]) -> bool:
    """Whether this run is a Nagios plugin run (`--format nagios` anywhere), known before any
    option is parsed, so that even a usage error is reported as UNKNOWN."""
    return any(a == "--format=nagios" or (a == "--format" and b == "nagios") for a, b in zip(args, args[1:] + [""]))


class LateGlobals:
    """Accept the global options after the subcommand too (`tune check --format tsv --root DIR`):
    each command gets copies that set the same thing when given (later wins)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        taken = {o for p in self.params for o in p.opts}
        self.params += [make() for opts, make in LATE_OPTIONS if not taken & set(opts)]


def _late_root(ctx, param, value):
    if value is not None:
        ctx.obj.root = Path(value)


def _late_state_dir(ctx, param, value):
    if value is not None:
        ctx.obj.state_dir = Path(value)


def _late_format(ctx, param, value):
    if value is not None:
        console.set_format(value)


def _late_debug(ctx, param, value):
    if value:
        ctx.find_root().params["debug"] = True


LATE_OPTIONS = [
    (("--root",), lambda: click.Option(["--root"], metavar="DIR", expose_value=False, callback=_late_root,
                                       help="Same as the global --root, given after the command.")),
    (("--state-dir",), lambda: click.Option(["--state-dir"], metavar="DIR", expose_value=False,
                                            callback=_late_state_dir,
                                            help="Same as the global --state-dir, given after the command.")),
    (("--format",), lambda: click.Option(["--format"], type=click.Choice(console.FORMATS), expose_value=False,
                                         is_eager=True, callback=_late_format,
                                         help="Same as the global --format, given after the command.")),
    (("--debug",), lambda: click.Option(["--debug"], is_flag=True, expose_value=False, callback=_late_debug,
                                        help="Same as the global --debug, given after the command.")),
]


class Command(LateGlobals, click.Command):
    """Every proxytune command: accepts the global options after its name too."""


class Group(LateGlobals, click.Group):
    """Every proxytune command group below the top one."""
    command_class = Command
    group_class = type


Main.command_class = Command
Main.group_class = Group


def say_error(message: str, hint: str | None = None, kind: str = "error") -> None:
    """The one way an error reaches the terminal: each part one line, controls written as escapes
    (an internal error's text, a hint quoting a path, may carry hostile bytes)."""
    try:
        click.echo(f"proxytune: {kind}: {one_line(message)}", err=True)
        if hint:
            click.echo(f"hint: {one_line(hint)}", err=True)
    except OSError:
        pass        # the terminal is gone (an ssh drop): the journal and syslog still say it


def emit_json(doc) -> None:
    click.echo(json.dumps(doc, indent=2, default=str))


def emit_result(kind: str, data: dict, paths: list[str] | None = None) -> None:
    """Every --json output: the versioned result envelope around the command's data (`proxytune schema`)."""
    from proxytune.reports.schema import envelope
    emit_json(envelope(kind, data, paths))


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="proxytune")
@click.option("--root", envvar="PROXYTUNE_ROOT", default="/", show_default=True, metavar="DIR",
              help="Read and write configuration files (/etc/...) under DIR. Live settings (sysctls, "
                   "mounts, process limits) stay those of the namespace proxytune runs in; for an image "
                   "being built add `tune apply --files-only`.")
@click.option("--state-dir", envvar="PROXYTUNE_STATE_DIR", default="/var/lib/proxytune", show_default=True,
              metavar="DIR", help="Where the apply journal lives (rollback reads it).")
@click.option("--debug", is_flag=True, help="On an internal error, print the Python traceback.")
@click.option("--format", "table_format", type=click.Choice(console.FORMATS), envvar="PROXYTUNE_FORMAT",
              help="Tables boxed, or as tab-separated rows for awk and cut [tsv when stdout is not a terminal].")
@click.pass_context
def main(ctx, root, state_dir, debug, table_format):
    """Tune, diagnose and benchmark hosts that run web proxies.

    \b
    Examples (start here):
      proxytune report                       audit this host, write the report
      proxytune tune check                   audit against the default profile
      proxytune tune plan --persist          what apply would change, changing nothing
      proxytune tune apply --persist --yes   change it (journaled; `tune rollback` undoes)
    """
    console.set_format(table_format)
    ctx.obj = Host.from_env(root, state_dir)


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


# ---------------------------------------------------------------- tune

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


@main.group()
def tune():
    """Audit, apply and roll back a host profile; export it for other tools.

    \b
    Examples:
      proxytune tune check -p linux/squid     audit against Squid's profile
      proxytune tune apply --persist --yes    change the host (journaled) and keep it over a reboot
      proxytune tune rollback --yes           undo the last apply
    """


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


def emit_metrics(text: str, output: Path | None) -> None:
    """The textfile to stdout, or to FILE through the safe file layer (temp file + rename: node_exporter
    never reads half a file); a file that is there keeps its mode and owner."""
    if output is None:
        click.echo(text, nl=False)
        return
    from proxytune.tune import files
    files.atomic_write(output.absolute(), text)


@tune.command()
@profile_options
@monitor_options
@click.option("--json", "as_json", is_flag=True, help="Print the audit as result JSON.")
@click.pass_obj
def check(host, profile_ref, only, skip, service, user, cache_dirs, fmt, critical, output, as_json):
    """Audit this host against a profile: current, wanted, status, reason.

    Also inspects the running proxy: its real fd limit and use, its listen
    backlogs, and the atime mode of its cache directories. Changes nothing.
    Exit 0 when everything is met, 1 on drift or warnings, 2 on error
    (with --format nagios: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN).

    \b
    Examples:
      proxytune tune check                          the default profile, the proxy auto-detected
      proxytune tune check -p linux/nginx --only 'sysctl:*'
      proxytune tune check --service squid --cache-dir /var/spool/squid --json
      proxytune tune check --format nagios --critical 'sysctl:net.core.somaxconn'
      proxytune tune check --format prometheus -o /var/lib/prometheus/node-exporter/proxytune.prom
    """
    refuse_monitor_misuse(fmt, critical, output)
    audit = audit_mod.build(host, profile_ref, cli_params(service, user, cache_dirs), only, skip)
    doc = audit.to_json()
    if fmt == "nagios":
        state, line = audit_mod.nagios(doc, critical)
        click.echo(line)
        sys.exit(state)
    if fmt == "prometheus":
        emit_metrics(audit_mod.prometheus(doc), output)
    elif as_json:
        emit_result("audit", doc, doc["params"]["values"]["cache_dirs"])
    else:
        console.print_section(audit_mod.section(doc, f"tune check: {profile_ref}"))
        render.print_parameters(audit.plan)
    sys.exit(audit.exit_code())


FILES_ONLY_HELP = ("Write only the files (sysctl.d, limits.d, drop-ins, fstab) under --root; change "
                   "nothing live (for an image being built).")


def scope_notes(host, files_only: bool) -> list[str]:
    """What --root and --files-only mean for this run, said where the plan is shown."""
    notes = []
    if not host.live:
        notes.append(f"--root {host.root}: files are read and written under {host.root}; live settings "
                     "(sysctls, mounts, process limits) are those of the namespace this runs in")
    if files_only:
        notes.append("--files-only: only files are written; no live setting is changed")
    return notes


@tune.command("plan")
@profile_options
@click.option("--persist", is_flag=True, help="Include the files that make the changes permanent.")
@click.option("--files-only", is_flag=True, help=FILES_ONLY_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as result JSON.")
@click.pass_obj
def plan_cmd(host, profile_ref, only, skip, service, user, cache_dirs, persist, files_only, as_json):
    """Show exactly what `tune apply` would do. Changes nothing.

    \b
    Examples:
      proxytune tune plan --persist                 with the files that survive a reboot
      proxytune tune plan --skip 'mount:*' --json   everything but the mount options, as JSON
    """
    plan = plan_mod.build(profile_ref, host, cli_params(service, user, cache_dirs), only, skip)
    steps, notes = apply_mod.steps_for(plan, host, persist, files_only)
    notes = scope_notes(host, files_only) + notes + plan_mod.boot_warnings(plan, persist)
    if as_json:
        emit_result("plan", {**plan.to_json(), "steps": steps, "persist": persist, "files_only": files_only,
                             "root": str(host.root), "step_notes": notes})
    else:
        render.print_plan(plan, f"tune plan: {profile_ref}", show_target=True)
        flags = (" --persist" if persist else "") + (" --files-only" if files_only else "")
        console.say(f"apply{flags} would run {len(steps)} step(s):")
        render.print_steps(steps, "-")
        for n in notes:
            console.say(f"note: {n}")
    sys.exit(plan.exit_code())


@tune.command("apply")
@profile_options
@click.option("--persist", is_flag=True,
              help="Also write sysctl.d, fstab, limits.d so the change survives a reboot.")
@click.option("--files-only", is_flag=True, help=FILES_ONLY_HELP)
@click.option("--yes", "-y", is_flag=True, help="Do not ask; needed when there is no terminal.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as result JSON.")
@click.pass_obj
def apply_cmd(host, profile_ref, only, skip, service, user, cache_dirs, persist, files_only, yes, as_json):
    """Apply a profile: journal the old values, change, verify.

    Every old value is written to the journal before the first change, so
    `tune rollback` restores exactly, even after a crash half-way. A failure
    or Ctrl-C mid-apply undoes what was done (exit 2, or 130). Running it
    twice changes nothing. One apply or rollback at a time on this host,
    whatever its --state-dir (a lock in /run/proxytune, PROXYTUNE_LOCK_DIR);
    a second one is refused and says who holds it. SIGTERM and SIGHUP (an
    ssh drop) undo like Ctrl-C; under nohup the apply runs on to its end.
    Each apply and rollback leaves one line in the system journal (or
    syslog): who, profile, steps, result.

    \b
    Examples (as root):
      proxytune tune apply                          show the steps, ask, apply
      proxytune tune apply --persist --yes          also sysctl.d, limits.d, drop-ins; no question
      proxytune --root /srv/image tune apply --files-only --persist --yes
    """
    params = cli_params(service, user, cache_dirs)
    plan = plan_mod.build(profile_ref, host, params, only, skip)
    plan_mod.refuse_errors(plan)
    apply_mod.refuse_blocked(plan, files_only)
    for warning in plan_mod.boot_warnings(plan, persist):
        say_error(warning, kind="warning")
    steps, _ = apply_mod.steps_for(plan, host, persist, files_only)
    apply_mod.refuse_unprivileged(steps)
    if steps and not yes:
        if not sys.stdin.isatty():
            raise ProxytuneError("refusing to change the host without --yes (no terminal to ask)",
                                 f"review {command('tune plan')} first")
        with _asking(as_json):     # --json > file: the plan and the question stay on the terminal
            render.print_plan(plan, f"tune apply: {profile_ref}", show_target=True)
            render.print_steps(steps, "-")
            for n in scope_notes(host, files_only):
                click.echo(f"note: {n}")
            click.confirm(f"Apply these {len(steps)} step(s)?", abort=True)
    outcome = apply_mod.apply_plan(plan, host, persist, files_only, confirmed=None if yes else steps)
    outcome.notes[:0] = scope_notes(host, files_only)
    after = plan_mod.build(profile_ref, host, params, only, skip)
    if as_json:
        emit_result("apply", {"journal": outcome.entry and outcome.entry["id"], "steps": outcome.steps,
                              "files_only": files_only, "notes": outcome.notes, "verify": after.to_json()})
    else:
        render.print_outcome(outcome, "applied")
        render.print_plan(after, "verify")
    sys.exit(after.exit_code())


def _asking(as_json: bool):
    """Where a prompt and what it asks about go: stderr when stdout carries JSON."""
    import contextlib
    return contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()


@tune.command()
@click.option("--id", "entry_id", metavar="ID", help="Journal entry to undo [the latest open one].")
@click.option("--force", is_flag=True,
              help="Also undo values and files changed by someone since the apply (normally kept and reported).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask; needed when there is no terminal.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as result JSON.")
@click.pass_obj
def rollback(host, entry_id, force, yes, as_json):
    """Restore what the last apply (or an interrupted one) changed, where it is still ours.

    A value or file changed since the apply is kept and reported (exit 1;
    the entry stays open, `--force` finishes it). Exit 2 when a step failed.

    \b
    Examples (as root):
      proxytune tune rollback                       show what it restores, ask, restore
      proxytune tune rollback --id 20250101T120000-4242-3 --yes
    """
    journal.check_id(entry_id)
    entry = journal.find(host.state_dir, entry_id)
    apply_mod.refuse_unprivileged([s for s in entry["steps"] if not s.get("undone")])
    if not yes:
        if not sys.stdin.isatty():
            raise ProxytuneError("refusing to change the host without --yes (no terminal to ask)")
        with _asking(as_json):
            click.echo(f"journal {entry['id']} ({journal.status(entry)}, profile {entry['profile']}) will restore:")
            render.print_steps([s for s in entry["steps"] if not s.get("undone")], "-", undo=True)
            click.confirm("Roll back?", abort=True)
    outcome = apply_mod.rollback(host, entry["id"], force)
    if as_json:
        emit_result("rollback", {"journal": entry["id"], "state": outcome.entry["state"],
                                 "steps": outcome.steps, "kept": outcome.kept, "notes": outcome.notes,
                                 "failures": outcome.failures})
    else:
        render.print_outcome(outcome, "rolled back")
    sys.exit(2 if outcome.failures else 1 if outcome.kept else 0)


@tune.command()
@click.option("--json", "as_json", is_flag=True, help="Print the journal entries as JSON.")
@click.pass_obj
def history(host, as_json):
    """List the apply journal, oldest first: id, state (an apply whose process is gone
    shows as interrupted), profile, steps done.

    \b
    Examples:
      proxytune tune history
      proxytune tune history --json
    """
    rows = [{"id": e["id"], "seq": e["seq"], "state": journal.status(e), "profile": e["profile"],
             "steps": len(e["steps"]), "done": e["done"]} for e in journal.entries(host.state_dir)]
    if as_json:
        emit_result("history", {"entries": rows})
        return
    if not rows:
        console.say(f"journal is empty ({journal.directory(host.state_dir)})")
        return
    console.print_rows("apply journal", ["id", "state", "profile", "steps done"],
                      [[r["id"], r["state"], r["profile"], f"{r['done']}/{r['steps']}"] for r in rows])


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print what is applied as result JSON.")
@click.pass_obj
def status(host, as_json):
    """What is applied on this host now, and what drifted since (like `tuned-adm active`).

    For every apply still open in the journal: profile, when, by whom, its
    steps, and each step the host no longer holds as apply wrote it. Changes
    nothing. Exit 0 when nothing drifted, 1 on drift (or an interrupted
    apply, or a rollback left incomplete), 2 on error.

    \b
    Examples (as root):
      proxytune status                          what is applied, and what drifted since
      proxytune status --json
    """
    from proxytune.tune import status as status_mod
    entries = status_mod.applied(host)
    if as_json:
        from proxytune.reports.schema import envelope
        emit_json(envelope("status", {"state_dir": str(host.state_dir), "applied": entries}))
    elif not entries:
        click.echo(f"nothing applied (journal {journal.directory(host.state_dir)})")
    for e in [] if as_json else entries:
        since = f"{len(e['drift'])} drifted since" if e["drift"] else "no drift since"
        click.echo(one_line(f"{e['profile']}: {e['state']} {e['applied']} by {status_mod.who(e['by'])}, "
                            f"{e['steps']} step(s), journal {e['journal']}: {since}"))
        for d in e["drift"]:
            click.echo(one_line(f"  drift: {d}"))
    sys.exit(status_mod.exit_code(entries))


@tune.command()
@profile_options
@click.option("--format", "fmt", type=click.Choice(export_mod.FORMATS), required=True,
              help="Target format.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write to FILE [stdout].")
@click.option("--tuned-include", metavar="NAME",
              help="Base tuned profile the tuned export includes [tuned-adm recommend, else throughput-performance].")
@click.pass_obj
def export(host, profile_ref, only, skip, service, user, cache_dirs, fmt, output, tuned_include):
    """Render a profile for sysctl.d, limits.d, systemd, tuned, Ansible or FreeBSD.

    \b
    sysctl.d (and tuned's ranges) are computed against this host so that
    loading them never lowers a value: regenerate them on each host.

    \b
    Examples:
      proxytune tune export --format sysctl.d -o 90-proxy.conf
      proxytune tune export --format tuned -p linux/squid
      proxytune tune export --format ansible -o proxytune.yml    then: ansible-playbook -i hosts proxytune.yml
    """
    prof = profile_mod.load(profile_ref, root=host.root)
    from proxytune.tune import params as params_mod
    values, variables = export_mod.as_variables(*params_mod.resolve(host, cli_params(service, user, cache_dirs),
                                                                     prof.params))
    settings, _ = profile_mod.expand(prof, values, host)
    if tuned_include is not None and not export_mod.export_host.NAME.fullmatch(tuned_include):
        raise ProxytuneError(f"--tuned-include {tuned_include!r} is not a tuned profile name")
    text = export_mod.export(fmt, plan_mod.select(settings, only, skip), profile_ref, prof.os,
                             export_mod.Target(host, tuned_include, variables))
    if output:
        files_mod.write_output(output, text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)


# ---------------------------------------------------------------- fleet

def fleet_options(f):
    """-i, --profile, --only/--skip, --limit, --forks, --json: shared by every fleet command."""
    options = [
        click.option("--inventory", "-i", required=True, metavar="FILE", help="Ansible inventory (INI, YAML, ...)."),
        click.option("--profile", "-p", "profile_ref", default=DEFAULT_PROFILE, show_default=True,
                     metavar="NAME|PATH", help="A catalog name, or a file (a path starting with / ./ ../ or ending in .toml; sent to every host)."),
        click.option("--only", multiple=True, metavar="GLOB", help="Only settings matching (repeatable)."),
        click.option("--skip", multiple=True, metavar="GLOB", help="Leave out settings matching (repeatable)."),
        click.option("--limit", metavar="PATTERN", help="Ansible host pattern, e.g. 'proxies:!canary'."),
        click.option("--forks", type=click.IntRange(1, 500), default=5, show_default=True,
                     help="Hosts Ansible works on at once."),
        click.option("--timeout", type=click.IntRange(10, 86400), default=900, show_default=True, metavar="SECONDS",
                     help="Per host and task: a host that takes longer is stopped there and counts as failed."),
        click.option("--no-install", is_flag=True,
                     help="Do not apt-get the Debian packages a host lacks (python3-click, -rich, -jsonschema); "
                          "such a host fails, naming them."),
        click.option("--json", "as_json", is_flag=True, help="Print the fleet result JSON."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def run_fleet(action, opts: dict, body=None):
    """Prepare the fleet, run `body(fleet)` (default: one read-only play), print, exit with its code."""
    from proxytune.tune import fleet as fleet_mod
    with fleet_mod.Fleet(opts["inventory"], opts["profile_ref"], tuple(opts["only"]), tuple(opts["skip"]),
                         opts["limit"], opts["forks"], opts.get("persist", False),
                         progress=lambda line: click.echo(f"fleet: {console.term_text(line, markup=False)}", err=True),
                         timeout=opts["timeout"], install=not opts["no_install"]) as fl:
        data = (body or (lambda f: fleet_mod.run_simple(f, action)))(fl.prepare())
    show_fleet(data, opts["as_json"])
    sys.exit(data["exit"])


def show_fleet(data, as_json):
    from proxytune.reports import fleet as fleet_report
    if as_json:
        emit_result("fleet", data)
        return
    fleet_report.print_terminal(data)


@main.group()
def fleet():
    """Audit, apply and roll back many hosts: proxytune runs on each host through ansible-playbook.

    \b
    Examples:
      proxytune fleet check -i hosts.ini                        hosts x settings, changes nothing
      proxytune fleet apply -i hosts.ini --canary px1 --serial 5 --yes
      proxytune fleet rollback -i hosts.ini --yes               undo the last fleet apply

    Exit 0 all met, 1 drift somewhere, 2 a host unreachable or failed.
    """


@fleet.command("check")
@fleet_options
def fleet_check(**opts):
    """`tune check` on every host; one hosts x settings matrix. Changes nothing.

    \b
    Examples:
      proxytune fleet check -i hosts.ini
      proxytune fleet check -i hosts.ini --limit 'proxies:!canary' -p linux/squid --json
    """
    run_fleet("check", opts)


@fleet.command("plan")
@fleet_options
@click.option("--persist", is_flag=True, help="Include the files that make the changes permanent.")
def fleet_plan(**opts):
    """`tune plan` on every host: what apply would change there. Changes nothing.

    \b
    Examples:
      proxytune fleet plan -i hosts.ini --persist
    """
    run_fleet("plan", opts)


@fleet.command("doctor")
@fleet_options
def fleet_doctor(**opts):
    """Can proxytune run on every host: ssh, become, python3 with click/rich/jsonschema, probe caps.

    \b
    Examples:
      proxytune fleet doctor -i hosts.ini --forks 20
    """
    run_fleet("doctor", opts)


@fleet.command("apply")
@fleet_options
@click.option("--persist", is_flag=True, help="Also write sysctl.d, fstab, limits.d on each host.")
@click.option("--serial", type=click.IntRange(1, 10000), metavar="N", help="Hosts per batch after the canary [all].")
@click.option("--canary", metavar="HOST", help="Apply and verify on this host first; stop if it fails.")
@click.option("--verify-cmd", metavar="CMD",
              help="Run here after the canary's apply (no shell; $PROXYTUNE_FLEET_HOST is the canary), "
                   "e.g. a load test; non-zero exit rolls the canary back and stops.")
@click.option("--yes", "-y", is_flag=True, help="Needed: this changes every host it reaches.")
@click.pass_obj
def fleet_apply(host, serial, canary, verify_cmd, yes, **opts):
    """Rolling apply: the canary first, then --serial batches; journaled on every host.

    \b
    Examples:
      proxytune fleet apply -i hosts.ini --persist --canary px1 --serial 5 --yes
      proxytune fleet apply -i hosts.ini --canary px1 --verify-cmd ./loadtest.sh --yes
    """
    from proxytune.tune import fleet_rollout
    if not yes:
        raise ProxytuneError("fleet apply changes every host it reaches: add --yes",
                             f"review {command('fleet plan -i INVENTORY')} first")
    run_fleet("apply", opts, body=lambda f: fleet_rollout.apply(f, host.state_dir, canary, serial, verify_cmd))


@fleet.command("rollback")
@fleet_options
@click.option("--yes", "-y", is_flag=True, help="Needed: this changes every host the last apply reached.")
@click.pass_obj
def fleet_rollback(host, yes, **opts):
    """Undo the last fleet apply on every host it reached (each host's own journal entry).

    \b
    Examples:
      proxytune fleet rollback -i hosts.ini --yes
    """
    from proxytune.tune import fleet_rollout
    if not yes:
        raise ProxytuneError("fleet rollback changes every host the last apply reached: add --yes")
    run_fleet("rollback", opts, body=lambda f: fleet_rollout.rollback(f, host.state_dir))


# ---------------------------------------------------------------- bench

def finish_bench(data: dict, name: str, output: Path | None, as_json: bool, show=None) -> None:
    """Wrap a bench result in the result schema, store it, print it (JSON, show(data) for a result the
    report has no section for, else the report's own section). Stored at --output, else
    proxytune-results/NAME-STAMP.json."""
    import time
    from proxytune.reports.schema import envelope
    from proxytune.reports.tables import section_for
    doc = envelope("bench", data)
    path = output or Path("proxytune-results") / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    files_mod.write_output(path, json.dumps(doc, indent=1) + "\n")
    if as_json:
        emit_json(doc)
    else:
        if show:
            show(data)
        else:
            console.print_section(section_for(name, data))
        click.echo(f"result: {path}")
    failed = data.get("unavailable_points", [])
    if data.get("available") is False or failed:
        why = data.get("reason") or f"{len(failed)} measurement(s) failed, first: {failed[0]['reason']}"
        say_error(f"bench {name}: {why}", f"the result ({'JSON above' if as_json else path}) records what failed")
        sys.exit(2)


@main.group()
def bench():
    """Microbenchmarks that reproduce the classic proxy results on this kernel.

    \b
    Examples:
      proxytune bench events --quick                select/poll/epoll/io_uring in about 15 s
      proxytune bench storage --quick               ufs vs largefile vs rawdev (as root)
    """


@bench.command("events")
@click.option("--quick", is_flag=True, help="A small grid (about 15 s); the full sweep is what docs/BENCHMARKS.md quotes.")
@click.option("--backend", "backends", multiple=True, metavar="NAME",
              help="Only these mechanisms (select, poll, epoll, io_uring, io_uring-multishot, kqueue).")
@click.option("--pin", type=int, metavar="CPU", help="Pin the harness to one CPU.")
@click.option("--tcp", is_flag=True, help="TCP loopback connections instead of socketpairs.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Result JSON file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result JSON.")
def bench_events(quick, backends, pin, tcp, output, as_json):
    """select / poll / epoll / io_uring / kqueue: cost per wait against idle descriptors.

    \b
    Sweeps N idle descriptors (1..10,000) with K ready (hot: the same K;
    cold: rotating), then registration churn, events per call as load rises
    (Mogul's batching), libevent's bench workload, and perf's epoll
    benchmark as an outside reference. Each point: warm-up, >= 5 repetitions,
    median and spread; points taken while the machine was busy are flagged.

    \b
    Examples:
      proxytune bench events --quick
      proxytune bench events --backend epoll --backend io_uring --pin 2 -o events.json
    """
    from proxytune.microbench import events
    data = events.run(quick=quick, backends=list(backends), pin=pin, tcp=tcp, quiet=as_json)
    finish_bench(data, "events", output, as_json)


@bench.command("fdscan")
@click.option("--quick", is_flag=True, help="Three table sizes (a few seconds).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Result JSON file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result JSON.")
def bench_fdscan(quick, output, as_json):
    """Mogul's comm_select study: five ways to build select()'s interest sets.

    \b
    1 fd table of Squid-like entries, the 3 fields on 3 cache lines
    2 the 3 fields adjacent   3 a separate compact array of the 3 fields
    4 long-lived bitmaps      5 bitmaps + word-at-a-time result scan
    D1 misses per call from hardware counters, else cachegrind (D1 32K/8/64).

    \b
    Examples:
      proxytune bench fdscan --quick
    """
    from proxytune.microbench import fdscan
    finish_bench(fdscan.run(quick=quick, quiet=as_json), "fdscan", output, as_json)


@bench.command("storage")
@click.option("--quick", is_flag=True, help="ext4 only, 64 MiB cache, one repetition (about 1 minute); what the report runs.")
@click.option("--fs", "fss", metavar="LIST", help="Filesystems to make and test, e.g. ext4,xfs [ext2,ext4,xfs,btrfs].")
@click.option("--engine", "engines", multiple=True, type=click.Choice(["sync", "threads", "posix-aio", "io_uring"]),
              help="Only these I/O engines (repeatable).")
@click.option("--device", metavar="DEV", help="Block device for rawdev [a loop device over a sparse file]. "
              "Refused unless unused and blank (signatures, and reads across it); held O_EXCL during the run.")
@click.option("--force-destroy-data", is_flag=True,
              help="Let --device be used although it carries a signature or non-zero data. Destroys its data. "
                   "A mounted, swap or held device is refused even so.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Result JSON file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result JSON.")
def bench_storage(quick, fss, engines, device, force_destroy_data, output, as_json):
    """ufs vs largefile vs rawdev, with sync / threads / POSIX AIO / io_uring.

    \b
    The 2002 Squid paper's question on today's kernel: one file per object
    (ufs) against one log-structured large file or a raw device, under the
    PolyMix-3 content mix. Per filesystem (made on a loop device, relatime
    and noatime): fill twice the cache (final sync timed), then a steady
    hit/miss mix, then hits alone, each from a cold page cache. Metrics:
    objects/s, MB/s, latency percentiles, syscalls per object (counted with
    perf), CPU per object, hit ratio, device writes; fio gives the limit.
    Needs root (loop devices, mounts).

    \b
    Examples (as root):
      proxytune bench storage --quick
      proxytune bench storage --fs ext4,xfs --engine io_uring --engine sync -o storage.json
    """
    from proxytune.microbench import devices, storage
    require_root("it makes loop devices and mounts them")
    fs_list = [f.strip() for f in fss.split(",")] if fss else None
    if fs_list and (bad := [f for f in fs_list if f not in devices.MKFS]):
        raise ProxytuneError(f"unknown filesystem {bad[0]!r}", f"known: {', '.join(devices.MKFS)}")
    data = storage.run(quick=quick, fss=fs_list, device=device, force=force_destroy_data,
                       engines=list(engines) or None, quiet=as_json)
    finish_bench(data, "storage", output, as_json)


@bench.command("proxy")
@click.option("--quick", is_flag=True, help="8 s fill + 12 s steady per store, 100 connections (about 2 minutes).")
@click.option("--proxy", "proxies", multiple=True,
              type=click.Choice(proxy_kinds.names() + ["all"]),
              help="Proxy to start from Debian's package (repeatable; all = every one, every store) [squid].")
@click.option("--store", "stores", multiple=True,
              type=click.Choice([s for k in proxy_kinds.KINDS for s in k.stores + k.optional_stores]),
              help="Store (repeatable): " + ", ".join(f"{k.kind} {'/'.join(k.stores + k.optional_stores)}"
                                                       for k in proxy_kinds.KINDS) + " [every store of each proxy].")
@click.option("--concurrency", type=click.IntRange(1, 20000), metavar="N", help="wrk connections [100, full 200; with --compare-profile 400, full 600].")
@click.option("--idle", type=click.IntRange(0, 20000), metavar="N",
              help="Idle keep-alive client connections during steady [200, full 1000; --compare-profile 1000].")
@click.option("--target", metavar="HOST:PORT",
              help="Load a proxy you run instead of starting squid (it must reach 127.0.0.1, our origin).")
@click.option("--compare-profile", metavar="NAME|PATH", shell_complete=complete_profiles,
              help="Run before and after applying this profile (journaled, rolled back after).")
@click.option("--only", multiple=True, metavar="GLOB", help="With --compare-profile: only these settings.")
@click.option("--skip", multiple=True, metavar="GLOB", help="With --compare-profile: leave these out.")
@click.option("--yes", "-y", is_flag=True, help="With --compare-profile: change the host without asking.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Result JSON file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result JSON.")
@click.pass_obj
def bench_proxy(host, quick, proxies, stores, concurrency, idle, target, compare_profile, only, skip, yes, output,
                as_json):
    """A real proxy (Squid unless --proxy) under a PolyMix-like load through wrk.

    \b
    Starts an nginx origin with PolyMix-3 sized objects and the proxy
    (Debian's package, generated config, own temp dir) per store; wrk sends
    absolute-URI requests whose recurrence gives about 55% hits, while a
    helper holds idle keep-alive clients. Fill, then steady (measured):
    throughput, latency of hits and misses (a sequential probe), hit ratio
    from the proxy's own log or counters (else X-Cache), syscalls and
    device writes per request, errors by kind. Everything started is
    stopped. --proxy all: every proxy and store in one run (the storage
    question on real caches).

    \b
    --compare-profile linux/proxy: the same load as the host is, then with
    the profile applied (the proxy restarted with the service's new
    LimitNOFILE), then rolled back. Needs --yes.

    \b
    Examples (as root):
      proxytune bench proxy --quick
      proxytune bench proxy --proxy nginx --store proxy_cache --concurrency 200
      proxytune bench proxy --compare-profile linux/squid --yes
      proxytune bench proxy --target 127.0.0.1:3128   a proxy you run (no root needed)
    """
    from proxytune.microbench import proxybench
    if target:
        import re as _re
        if not _re.fullmatch(r"[\w.\-]+:\d{1,5}", target) or not 0 < int(target.rsplit(":", 1)[1]) < 65536:
            raise ProxytuneError(f"--target must be HOST:PORT, not {target!r}", "e.g. --target 127.0.0.1:3128")
        if compare_profile or stores or proxies:
            raise ProxytuneError("--target loads your proxy; --proxy, --store and --compare-profile start our own")
    else:
        require_root("it starts squid, which drops privileges to user proxy")
    if compare_profile:
        if not yes:
            raise ProxytuneError("--compare-profile changes the host (journaled, rolled back after)",
                                 f"add --yes; {command('tune plan --profile ...')} shows the changes")
        if len(proxies) > 1 or "all" in proxies:
            raise ProxytuneError("--compare-profile runs one proxy before and after", "give one --proxy")
        data = proxybench.compare_profile(host, compare_profile, (stores or (None,))[0], quick, concurrency,
                                          idle, only, skip, as_json, proxy=(proxies or ("squid",))[0])
    else:
        data = proxybench.run(quick, list(stores) or None, concurrency, idle, None, as_json, target=target,
                              proxies=list(proxies) or None)
    finish_bench(data, "proxy", output, as_json)


# ---------------------------------------------------------------- probe / doctor

def target_options(f):
    for opt in reversed([
            click.option("--pid", type=int, metavar="PID", help="The process to probe."),
            click.option("--comm", metavar="NAME", help="Every process with this name (e.g. nginx: master and workers)."),
            click.option("--duration", "-d", default="10", show_default=True, metavar="S", callback=duration_option,
                         help=f"Length of the observation window, seconds (at most {MAX_SECONDS:g}).")]):
        f = opt(f)
    return f


@main.group()
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
    sys.exit(0 if all(v["ok"] for k, v in c["capabilities"].items() if k != "container") else 1)


@probe.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the catalog as JSON.")
def probe_list(as_json):
    """The bpftrace scripts in probes/, each runnable standalone: bpftrace probes/NAME.bt PID.

    \b
    Examples:
      proxytune probe list
    """
    from proxytune.probes import bpftrace
    cat = bpftrace.catalog()
    if as_json:
        emit_result("probe", {"probe": "list", "scripts": [
            {"name": s.name, "path": str(s.path), "purpose": s.purpose, "tracepoints": s.tracepoints}
            for s in cat.values()]})
        return
    console.print_rows("bpftrace catalog", ["name", "purpose", "tracepoints"],
                      [[s.name, s.purpose, ", ".join(s.tracepoints)] for s in cat.values()])


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
    from proxytune.probes import bpftrace, caps, proc, render as prender
    cat = bpftrace.catalog()
    if name not in cat:
        raise ProxytuneError(f"no probe named {name!r}", f"known: {', '.join(cat)}")
    pids = proc.resolve(pid, comm)
    caps.require_tracefs()          # an unreadable tracefs is not a kernel without the tracepoints
    if missing := bpftrace.missing_tracepoints(cat[name]):
        raise ProxytuneError(f"{name} needs tracepoints this kernel lacks: {', '.join(missing)}")
    maps = bpftrace.run_for([cat[name]], pids, duration)
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
    from proxytune.core import procgroup
    from proxytune.probes import caps, perf, proc, target
    pids = proc.resolve(pid, comm)
    if os.geteuid() != 0 and not (sampling := caps.perf_sampling()).ok:     # else perf records nothing,
        raise needs_root(sampling.why) if shutil.which("perf") else ProxytuneError(sampling.why)  # read as idle
    with procgroup.Children() as kids:
        rec = perf.Record(kids)
        watch = target.Watch(pids)
        watch.wait(duration)
        r = rec.stop(pids)
    if watch.all_gone:
        raise watch.gone_error(duration)
    if as_json:
        emit_result("probe", {"probe": "hotspots", "pids": pids, **r})
        return
    if not r.get("available"):
        raise ProxytuneError(r["reason"])
    click.echo(f"{r['samples']} samples of pids {pids} at {r['hz']} Hz; split: "
               + ", ".join(f"{k} {v:.0%}" for k, v in r["split"].items()))
    for t in r["top"]:
        where = console.term_text(f"{t['function']}  ({t['dso']}, {t['where']})", markup=False)
        click.echo(f"  {t['share']:6.1%}  {where}")


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
    from proxytune.probes import caps, perf, render as prender
    hw = perf.hw_cache_misses(list(command)) if caps.hardware_counters().ok else None
    r = hw or perf.cachegrind(list(command))
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
    from proxytune.probes import overhead
    from proxytune.microbench.runner import progress
    require_root("it attaches bpftrace and perf -a")
    if component not in overhead.components():
        raise ProxytuneError(f"unknown --component {component!r}", "one of: " + ", ".join(overhead.components()))
    with progress(as_json) as bar:
        task = bar.add_task(f"nginx under wrk, {component} off/on pairs", total=reps)
        data = overhead.measure(seconds, reps, connections, progress=lambda: bar.advance(task), component=component,
                                pace_ms=pace_ms, mechanisms=mechanisms)

    def show(d):
        if "mechanisms" in d:
            u, m = d["mechanisms"]["units"], d["mechanisms"]["model"]
            click.echo(f"{component} adds {u['syscall']['added_ns']:+.1f} ns of CPU per syscall and "
                       f"{u['context_switch']['added_ns']:+.0f} ns per context switch; with nginx's "
                       f"{d['mechanisms']['nginx_per_request']['syscall']:.2f} syscalls and "
                       f"{d['mechanisms']['nginx_per_request']['context_switch']:.3f} switches per request: "
                       f"{m['overhead']:+.2%} per request (CI {m['overhead_ci'][0]:+.2%} to {m['overhead_ci'][1]:+.2%})")
            per = d["mechanisms"]["nginx_per_request"]
            for unit, what, count in (("tcp_exchange", "TCP round trip", "segments read"),
                                      ("connection", "TCP connection opened and closed", "connections accepted")):
                if unit in u:
                    click.echo(f"  and {u[unit]['added_ns']:+.0f} ns per {what}, with {per.get(unit) or 0:.4f} "
                               f"{count} per request")
            _program_costs(d.get("programs") or {})
            return
        click.echo(f"nginx CPU per request: {d['off_us_per_request']['median']:.2f} us without {component}, "
                   f"{d['on_us_per_request']['median']:.2f} us with it: overhead {d['overhead']:+.1%} "
                   f"({d['overhead_ci_confidence']:.1%} CI: {d['verdict']}) "
                   f"(pairs: {', '.join(f'{x:+.1%}' for x in d['overhead_per_pair'])}); "
                   f"throughput {d['rps_off']:,.0f} -> {d['rps_on']:,.0f} req/s")
        _program_costs(d.get("programs") or {})
    finish_bench(data, "doctor-overhead", output, as_json, show)


def _program_costs(p: dict) -> None:
    """`probe overhead`'s per-program lines: what each BPF program's body costs per run and how often it ran."""
    if not p.get("available"):
        click.echo(f"BPF programs' own cost: unavailable ({p.get('reason', 'not measured')})")
        return
    click.echo(f"BPF programs under the same load, {p['seconds']:.1f} s with kernel.bpf_stats_enabled "
               "(program bodies only; the tracepoint's and the syscall slow path's cost are not in them):")
    for r in p["programs"]:
        ns = f"{r['ns_per_run']:8.0f} ns/run" if r["ns_per_run"] is not None else "      never ran"
        click.echo(f"  {r['attached']:<36} {ns} {r['runs_per_s']:12,.0f} runs/s {r['cpu_ns_per_s'] / 1e3:9.1f} us/s")


@main.command()
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
      syn-backlog-overflow, ephemeral-port-exhaustion, poll-scan,
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
    if as_json or fmt in MONITOR_FORMATS:
        r = doctor_mod.diagnose(pids, duration, host=host, profile_ref=profile_ref, cache_dirs=list(cache_dirs),
                                deep=deep, use_perf=not no_perf)
    else:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
        with Progress(TextColumn("watching {task.description}"), BarColumn(), TimeRemainingColumn(),
                      console=console.console(), transient=True) as bar:
            task = bar.add_task(prender.watching(pids), total=duration)
            r = doctor_mod.diagnose(pids, duration, host=host, profile_ref=profile_ref, cache_dirs=list(cache_dirs),
                                    deep=deep, use_perf=not no_perf,
                                    tick=lambda t: bar.update(task, completed=t))
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


# ---------------------------------------------------------------- profiles

@main.group()
def profiles():
    """List and show the shipped profiles.

    \b
    Examples:
      proxytune profiles list
      proxytune profiles show linux/squid
    """


@profiles.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as a JSON list.")
@click.pass_obj
def profiles_list(host, as_json):
    """Profiles by name: the site's (/etc/proxytune/profiles), the user's
    ($XDG_CONFIG_HOME/proxytune/profiles), then the shipped ones; a site or
    user profile hides a shipped one of the same name.

    \b
    Examples:
      proxytune profiles list
      proxytune profiles list --json
    """
    rows, warnings = profile_mod.listing(host.root)
    if as_json:
        emit_result("profiles", {"profiles": rows, "ignored": warnings})
    else:
        console.print_rows("profiles", ["name", "source", "os", "settings", "description"],
                          [[r[k] for k in ("name", "source", "os", "settings", "description")] for r in rows])
    for note in warnings:
        say_error(note, kind="warning")


@profiles.command("show")
@click.argument("name", shell_complete=complete_profiles)
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
@click.pass_obj
def profiles_show(host, name, as_json):
    """Every setting of a profile (with includes resolved): mode, value, reason, source.

    \b
    Examples:
      proxytune profiles show linux/proxy
      proxytune profiles show ./site.toml --json
    """
    p = profile_mod.load(name, root=host.root)
    rows = [{"setting": f"{r.backend}:{r.key}", "mode": r.mode, "wanted": r.wanted, "reason": r.reason,
             "source": r.source} for r in p.raw]
    if as_json:
        emit_result("profile", {"name": name, "os": p.os, "description": p.description, "params": p.params,
                                "settings": rows})
        return
    click.echo(f"{name} ({p.os}): {p.description}\nfile: {p.path}")
    for r in p.raw:
        from proxytune.tune.modes import describe
        click.echo(f"  {r.backend}:{r.key}  {describe(r.mode, r.wanted)}\n      {r.reason}  [{r.source}]")


# ---------------------------------------------------------------- report

@main.group(invoke_without_command=True)
@click.option("--output", "-o", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("proxytune-report"), show_default=True, help="Directory for report.{html,md,json}.")
@click.option("--profile", "-p", "profile_ref", default=DEFAULT_PROFILE, show_default=True, metavar="NAME|PATH", shell_complete=complete_profiles,
              help="Profile for the host audit.")
@click.option("--no-bench", is_flag=True, help="Only the host audit, no benchmarks.")
@click.option("--with-proxy", is_flag=True, help="Also bench proxy --quick (squid ufs/aufs/rock under load, ~2 min) and the doctor on an nginx it starts.")
@click.option("--full", is_flag=True, help="The longer, more precise run of the same sections: every filesystem, "
              "engine and N, more repetitions (about 27 min here, against about 1 min).")
@click.option("--from", "from_files", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              metavar="FILE", help="Use a saved bench (or report) result instead of running it (repeatable).")
@click.pass_context
def report(ctx, out_dir, profile_ref, no_bench, with_proxy, from_files, full):
    """Audit this host, run the quick benchmarks, write the report.

    \b
    The main job, about a minute here (--full: the same sections, longer
    and more precise). Sections: the host audit against the profile (with
    the running proxy's limits, backlogs and cache-directory mounts; its
    summary is printed first), the event mechanisms (bench events), Mogul's
    comm_select study (bench fdscan), the object stores (bench storage, as
    root) and, as root, Cooper's host settings: a Squid the report starts in
    a private network namespace, before and after the profile's fd limit
    and net.* settings, watched by the doctor for its CPU split. Nothing of
    the host changes. Writes report.html (self-contained: figures embedded,
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
    from proxytune.reports import build
    saved = build.saved_benches(list(from_files)) if from_files else None
    paths, doc = build.write_report(ctx.obj, profile_ref, out_dir, benches=not no_bench and not saved,
                                    with_proxy=with_proxy and not (saved and "proxy" in saved), saved=saved,
                                    full=full, on_audit=_host_summary)
    for item in doc["data"]["summary"][:5]:
        what, why, do = (console.term_text(item[k], markup=False) for k in ("what", "why", "command"))
        click.echo(f"{item['rank']}. {what}\n   why: {why}\n   do:  {do}")
    for row in doc["data"]["sections"]["seeds"]["rows"]:
        click.echo(console.term_text(f"seed: {row['seed']}: {row['verdict']} ({row['reason']})", markup=False))
    if "plots" in doc["data"]["skipped"]:
        click.echo(f"proxytune: {doc['data']['skipped']['plots']}", err=True)
    for p in paths:
        click.echo(f"wrote {p}")


def _host_summary(audit: dict) -> None:
    """The audit's verdict and its commands, printed before the benchmarks start."""
    from proxytune.reports import summary
    items = summary.from_audit(audit)
    counts = {}
    for r in audit["settings"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    click.echo(console.term_text(f"host: profile {audit['profile']}: "
                                 + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), markup=False))
    for item in items:
        what, do = (console.term_text(item[k], markup=False) for k in ("what", "command"))
        click.echo(f"  {what}\n  do: {do}")


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
    from proxytune.reports import build, fleet as fleet_report
    doc = build.load_results([file])[0]
    if doc["kind"] != "fleet":
        raise ProxytuneError(f"{file} is a {doc['kind']} result, not a fleet result")
    show_fleet(doc["data"], False)
    for p in fleet_report.write(doc, out_dir):
        click.echo(f"wrote {p}")


# ---------------------------------------------------------------- schema

@main.command("schema")
@click.argument("kind", required=False, metavar="[KIND]")
def schema_cmd(kind):
    """Print the JSON Schema of proxytune's results: every --json output and result file is
    this envelope (schema, kind, created, host, data); KIND narrows it to one kind's data.

    \b
    Examples:
      proxytune schema                      the whole schema (every kind)
      proxytune schema audit > audit.json   what `tune check --json` prints
    """
    from proxytune.reports.schema import kind_schema
    emit_json(kind_schema(kind))


# ---------------------------------------------------------------- man, completion
# (what the .deb installs, for a pipx install or a checkout)

MAN_PAGES = {"proxytune": "8", "proxytune-profile": "5"}


def man_page(name: str) -> str:
    """A man page's roff: proxytune(8) from this command tree, or proxytune-profile(5)."""
    if name == "proxytune-profile":
        from proxytune.tune.profilepage import proxytune_profile_5
        return proxytune_profile_5(__version__)
    from proxytune.core.manpage import proxytune_8
    return proxytune_8(main, __version__)


@main.command("man")
@click.argument("page", type=click.Choice(list(MAN_PAGES)), default="proxytune")
@click.option("--install", is_flag=True,
              help="Write both pages under $XDG_DATA_HOME/man [~/.local/share/man], where man finds them "
                   "for commands in ~/.local/bin (pipx), instead of printing one.")
def man_command(page, install):
    """Print a man page as roff: proxytune(8) or the profile format, proxytune-profile(5).
    For a pipx install or a checkout; the Debian package installs both.

    \b
    Examples:
      proxytune man | man -l -                   read proxytune(8)
      proxytune man proxytune-profile | man -l -
      proxytune man --install && man proxytune
    """
    if not install:
        click.echo(man_page(page), nl=False)
        return
    from proxytune.tune import files
    top = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share").absolute() / "man"
    for name, section in MAN_PAGES.items():
        path = top / f"man{section}" / f"{name}.{section}"
        files.atomic_write(path, man_page(name))
        click.echo(f"wrote {path}")


@main.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell):
    """Print the shell completion script for SHELL (commands, options, profile and probe
    names). The Debian package installs it; for pipx or a checkout, load it yourself.

    \b
    Examples:
      proxytune completion bash > ~/.local/share/bash-completion/completions/proxytune
      proxytune completion zsh > ~/.zfunc/_proxytune
      proxytune completion fish > ~/.config/fish/completions/proxytune.fish
    """
    from click.shell_completion import get_completion_class
    script = get_completion_class(shell)(main, {}, "proxytune", "_PROXYTUNE_COMPLETE").source()
    click.echo(script, nl=False)


def run() -> None:
    """The `proxytune` command (console script, /usr/bin/proxytune, ./proxytune)."""
    main(prog_name="proxytune")


if __name__ == "__main__":
    run()

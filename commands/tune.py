"""`proxytune tune`: audit, plan, apply, roll back and export a host profile, and the journal's history."""

import sys
from pathlib import Path

import click

from proxytune.core import console
from proxytune.core.errors import ProxytuneError
from proxytune.core.invocation import command
from proxytune.tune import apply as apply_mod, audit as audit_mod, export as export_mod, journal, render, session
from proxytune.tune import files as files_mod

from .options import cli_params, monitor_options, profile_options, refuse_monitor_misuse
from .output import emit_metrics, emit_result, say_error


@click.group()
def tune():
    """Audit, apply and roll back a host profile; export it for other tools.

    \b
    Examples:
      proxytune tune check -p linux/squid     audit against Squid's profile
      proxytune tune apply --persist --yes    change the host (journaled) and keep it over a reboot
      proxytune tune rollback --yes           undo the last apply
    """


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
    req = session.Request(profile_ref, cli_params(service, user, cache_dirs), only, skip, persist, files_only)
    plan, steps, notes = session.preview(req, host)
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
    req = session.Request(profile_ref, cli_params(service, user, cache_dirs), only, skip, persist, files_only)
    plan, steps = session.prepare_apply(req, host, warn=lambda line: say_error(line, kind="warning"))
    if steps and not yes:
        _confirm_apply(req, host, plan, steps, as_json)
    outcome, after = session.apply_and_verify(req, host, plan, confirmed=None if yes else steps)
    if as_json:
        emit_result("apply", {"journal": outcome.entry and outcome.entry["id"], "steps": outcome.steps,
                              "files_only": files_only, "notes": outcome.notes, "verify": after.to_json()})
    else:
        render.print_outcome(outcome, "applied")
        render.print_plan(after, "verify")
    sys.exit(after.exit_code())


def _confirm_apply(req: session.Request, host, plan, steps: list[dict], as_json: bool) -> None:
    """Show the plan and its steps, and ask; refused where there is no terminal to ask."""
    if not sys.stdin.isatty():
        raise ProxytuneError("refusing to change the host without --yes (no terminal to ask)",
                             f"review {command('tune plan')} first")
    with _asking(as_json):     # --json > file: the plan and the question stay on the terminal
        render.print_plan(plan, f"tune apply: {req.profile}", show_target=True)
        render.print_steps(steps, "-")
        for n in session.scope_notes(host, req.files_only):
            click.echo(f"note: {n}")
        click.confirm(f"Apply these {len(steps)} step(s)?", abort=True)


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
    entry, pending = session.rollback_target(host, entry_id)
    if not yes:
        if not sys.stdin.isatty():
            raise ProxytuneError("refusing to change the host without --yes (no terminal to ask)")
        with _asking(as_json):
            click.echo(f"journal {entry['id']} ({journal.status(entry)}, profile {entry['profile']}) will restore:")
            render.print_steps(pending, "-", undo=True)
            click.confirm("Roll back?", abort=True)
    outcome = apply_mod.rollback(host, entry["id"], force)
    if as_json:
        emit_result("rollback", {"journal": entry["id"], "state": outcome.entry["state"],
                                 "steps": outcome.steps, "kept": outcome.kept, "notes": outcome.notes,
                                 "failures": outcome.failures})
    else:
        render.print_outcome(outcome, "rolled back")
    sys.exit(session.rollback_exit_code(outcome))


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
    rows = session.history(host)
    if as_json:
        emit_result("history", {"entries": rows})
        return
    if not rows:
        console.say(f"journal is empty ({journal.directory(host.state_dir)})")
        return
    console.print_rows("apply journal", ["id", "state", "profile", "steps done"],
                      [[r["id"], r["state"], r["profile"], f"{r['done']}/{r['steps']}"] for r in rows])


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
    text = export_mod.export_profile(host, profile_ref, cli_params(service, user, cache_dirs), fmt, only, skip,
                                     tuned_include)
    if output:
        files_mod.write_output(output, text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)

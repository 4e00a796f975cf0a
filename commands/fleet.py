"""`proxytune fleet`: audit, plan, apply and roll back many hosts through ansible-playbook."""

import sys

import click

from proxytune.core import console
from proxytune.core.errors import ProxytuneError
from proxytune.core.invocation import command

from .options import DEFAULT_PROFILE
from .output import emit_result


def fleet_options(f):
    """-i, --profile, --only/--skip, --limit, --forks, --json: shared by every fleet command."""
    options = [
        click.option("--inventory", "-i", required=True, metavar="FILE", help="Ansible inventory (INI, YAML, ...)."),
        click.option("--profile", "-p", "profile_ref", default=DEFAULT_PROFILE, show_default=True,
                     metavar="NAME|PATH", help="A catalog name, or a file (a path starting with / ./ ../ or ending in .toml). A file, or a site or user profile, is sent to every host as resolved here (includes merged, waivers kept)."),
        click.option("--only", multiple=True, metavar="GLOB", help="Only settings matching (repeatable)."),
        click.option("--skip", multiple=True, metavar="GLOB", help="Leave out settings matching (repeatable)."),
        click.option("--limit", metavar="PATTERN", help="Ansible host pattern, e.g. 'proxies:!canary'."),
        click.option("--forks", type=click.IntRange(1, 500), default=5, show_default=True,
                     help="Hosts Ansible works on at once, one worker process each on this machine "
                          "(sizing for large fleets: docs/BENCHMARKS.md)."),
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


@click.group()
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

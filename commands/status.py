"""`proxytune status`: what is applied on this host now, and what drifted since."""

import sys

import click

from proxytune.tune import status as status_mod

from .output import emit_result


@click.command()
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
    entries = status_mod.applied(host)
    if as_json:
        emit_result("status", {"state_dir": str(host.state_dir), "applied": entries})
    else:
        click.echo("\n".join(status_mod.lines(host, entries)))
    sys.exit(status_mod.exit_code(entries))

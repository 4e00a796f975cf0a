"""`proxytune profiles`: list and show the site's, the user's and the shipped profiles."""

import click

from proxytune.core import console
from proxytune.tune import profile as profile_mod, render

from .options import complete_profiles
from .output import emit_result, say_error


@click.group()
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
    if as_json:
        emit_result("profile", profile_mod.shown(name, p))
        return
    click.echo(render.profile_text(name, p))

"""Commands about proxytune itself: the result schema, the man pages and shell completion
(what the .deb installs, for a pipx install or a checkout)."""

import os
from pathlib import Path

import click

from proxytune.core.errors import one_line

from .output import emit_json


@click.command("schema")
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


MAN_PAGES = {"proxytune": "8", "proxytune-profile": "5"}


def man_page(name: str, root: click.Group) -> str:
    """A man page's roff: proxytune(8) from the command tree under root (cli.main), or proxytune-profile(5)."""
    if name == "proxytune-profile":
        from proxytune.tune.profilepage import proxytune_profile_5
        return proxytune_profile_5(root.version)
    from proxytune.core.manpage import proxytune_8
    return proxytune_8(root, root.version)


def _root() -> click.Group:
    """The command tree these commands document: the root group they were registered under."""
    return click.get_current_context().find_root().command


@click.command("man")
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
        click.echo(man_page(page, _root()), nl=False)
        return
    from proxytune.tune import files
    top = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share").absolute() / "man"
    pages = {top / f"man{section}" / f"{name}.{section}": man_page(name, _root()) for name, section in MAN_PAGES.items()}
    for path in files.write_outputs(pages, own_tree=True, keep=True):     # all checked first; never another's HOME
        click.echo(f"wrote {one_line(str(path))}")


@click.command("completion")
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
    script = get_completion_class(shell)(_root(), {}, "proxytune", "_PROXYTUNE_COMPLETE").source()
    click.echo(script, nl=False)

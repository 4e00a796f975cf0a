"""The command as the user invokes it, for hints: `./proxytune` from a checkout, `proxytune` installed.

A hint naming the checkout's launcher to someone who installed the .deb (or
a bare `proxytune` to someone in a checkout without it on PATH) sends them
to a command that does not exist. The checkout launcher exports PROXYTUNE_PROG
(its $0); it is believed only when it names this checkout's launcher, so a
value inherited from elsewhere cannot leak into an installed copy's hints.
"""

import os
import shlex
import shutil
from pathlib import Path

import click

from .errors import ProxytuneError

CHECKOUT = Path(__file__).resolve().parent.parent     # cli.py's directory
LAUNCHER = CHECKOUT / "proxytune"                     # only a checkout has it: the wheel and .deb do not


def prog() -> str:
    """How to run proxytune again, as this user would type it."""
    if not LAUNCHER.is_file():
        return "proxytune"                            # installed: /usr/bin/proxytune, pipx
    typed = os.environ.get("PROXYTUNE_PROG", "")
    if typed and _same(typed, LAUNCHER):
        on_path = shutil.which(os.path.basename(typed))
        return "proxytune" if on_path and _same(on_path, LAUNCHER) else shlex.quote(typed)
    if Path.cwd().resolve() == CHECKOUT:
        return "./proxytune"
    return shlex.quote(str(LAUNCHER))                 # cli.py run directly, from elsewhere


def command(words: str | None = None, root: bool = False) -> str:
    """`proxytune WORDS` for a hint, sudo in front when it needs root; WORDS default to the
    command being run (`tune apply ...`)."""
    return f"`{'sudo ' if root else ''}{prog()} {words or _current()}`"


def needs_root(why: str) -> ProxytuneError:
    """The error for a non-root run whose cause is not being root: never a hint to chown or chmod
    root's files to the user."""
    return ProxytuneError(f"{command_path()} needs root: {why}", f"run it as root: {command(root=True)}")


def command_path() -> str:
    """The subcommand being run, e.g. `tune apply` ("proxytune" outside the CLI)."""
    ctx = click.get_current_context(silent=True)
    return " ".join(ctx.command_path.split()[1:]) if ctx and ctx.parent else "proxytune"


def _current() -> str:
    path = command_path()
    return "..." if path == "proxytune" else f"{path} ..."


def require_root(why: str) -> None:
    """Refuse a non-root run before anything starts, saying why root is needed."""
    if os.geteuid() != 0:
        raise needs_root(why)


def _same(path: str, launcher: Path) -> bool:
    try:
        return Path(path).resolve() == launcher.resolve()
    except OSError:
        return False

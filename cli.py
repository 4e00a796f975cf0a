"""proxytune: tune, diagnose and benchmark web-proxy hosts.

The root of the CLI, and only that: the error boundary (Main), the global
options (also accepted after a command: the late globals), and the registry of
command groups, one module each in commands/. Exit codes everywhere: 0 all
good, 1 drift or findings, 2 usage or runtime error (also any unexpected
exception), 130 interrupted.
"""

import os
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

from proxytune.commands import bench, doctor, fleet, meta, probe, profiles, report, status, tune
from proxytune.commands.output import say_error
from proxytune.core import console, monitoring
from proxytune.core.errors import ProxytuneError, one_line
from proxytune.core.invocation import command
from proxytune.tune.host import Host

__version__ = "0.1.0"


class Main(click.Group):
    """Exit codes the README promises, whatever happens below: a ProxytuneError is one line
    and a hint (exit 2, or 130 when interrupted); Ctrl-C is 130; a permission denied to a
    non-root user is one line naming the path; any other exception is a bug, reported as one
    `internal error` line, exit 2 (its traceback only with --debug). Every command registered
    under it accepts the global options after its name too (add_command)."""

    version = __version__       # what `--version` and the man pages say

    def add_command(self, cmd, name=None):
        add_late_globals(cmd)
        super().add_command(cmd, name)

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


def add_late_globals(cmd: click.Command) -> None:
    """Accept the global options after the subcommand too (`tune check --format tsv --root DIR`):
    cmd and every command below it get copies that set the same thing when given (later wins),
    unless they have an option of that name themselves."""
    taken = {o for p in cmd.params for o in p.opts}
    cmd.params += [make() for opts, make in LATE_OPTIONS if not taken & set(opts)]
    for sub in getattr(cmd, "commands", {}).values():
        add_late_globals(sub)


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


# The registry, one command group per module of commands/; this order is the man page's.
GROUPS = (tune.tune, status.status, fleet.fleet, bench.bench, probe.probe, doctor.doctor, profiles.profiles,
          report.report, meta.schema_cmd, meta.man_command, meta.completion)
for _group in GROUPS:
    main.add_command(_group)


def run() -> None:
    """The `proxytune` command (console script, /usr/bin/proxytune, ./proxytune)."""
    main(prog_name="proxytune")


if __name__ == "__main__":
    run()

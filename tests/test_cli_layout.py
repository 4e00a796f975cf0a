"""The CLI's shape (issue 29): cli.py is the root only (error boundary, global options,
the registry), each command group is one module of commands/ (that nothing below the CLI
imports it back is test_layers.py's)."""

import ast

from conftest import REPO


SHARED = {"options", "output"}      # what command modules may import from each other


def imported(path) -> list[str]:
    """Every module path imports, `from proxytune import cli` as proxytune.cli; relative ones as .name."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            out += [f"{base}.{a.name}" if base in ("proxytune", ".") else base for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


def test_a_command_module_shares_only_options_and_output():
    for path in (REPO / "commands").glob("*.py"):
        others = {m.split(".")[-1] for m in imported(path) if m.startswith((".", "proxytune.commands"))}
        assert others <= SHARED, (path.name, others - SHARED)
        assert "proxytune.cli" not in imported(path), path.name    # run as a script, cli.py is __main__


def test_every_command_is_registered_from_its_own_module():
    """No command is defined in cli.py: each top-level command or group comes from commands/,
    and a group's subcommands from the same module as the group."""
    from proxytune.cli import main

    def module(cmd) -> str:
        return (cmd.callback.__module__ if cmd.callback else "") or ""
    for name, cmd in main.commands.items():
        assert module(cmd).startswith("proxytune.commands."), (name, module(cmd))
        for sub_name, sub in getattr(cmd, "commands", {}).items():
            assert module(sub) == module(cmd), (name, sub_name, module(sub))


def test_every_command_takes_the_global_options_after_its_name():
    """The late globals reach every command registered under the root, however deep."""
    import click
    from proxytune.cli import main

    def commands(cmd):
        for sub in getattr(cmd, "commands", {}).values():
            yield sub
            yield from commands(sub)
    for cmd in commands(main):
        opts = {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts}
        assert {"--root", "--state-dir", "--format", "--debug"} <= opts, cmd.name

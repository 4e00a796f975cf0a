#!/usr/bin/env python3
"""Generate proxytune(8) from the CLI's own help: the click command tree,
each command's docstring and each option's help, so the page cannot drift
from `proxytune --help`. Prints roff on stdout.

    python3 packaging/manpage.py > proxytune.8
"""

import importlib.machinery
import inspect
import importlib.util
import sys
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent

EXTRA = {
    "ENVIRONMENT": [
        ("PROXYTUNE_ROOT, PROXYTUNE_STATE_DIR", "Defaults for --root and --state-dir."),
        ("PROXYTUNE_FORMAT", "Default for --format (table or tsv)."),
        ("PROXYTUNE_LOCK_DIR", "Where apply and rollback take the host-wide lock [/run/proxytune]."),
        ("PROXYTUNE_JOURNAL_SOCKET, PROXYTUNE_SYSLOG_SOCKET",
         "Where apply and rollback send their log line [/run/systemd/journal/socket, else /dev/log]."),
        ("PROXYTUNE_CACHE_DIR", "Where the C harnesses are built [/var/cache/proxytune as root, "
                                "else $XDG_CACHE_HOME/proxytune]."),
        ("XDG_CONFIG_HOME", "The user's profiles are in $XDG_CONFIG_HOME/proxytune/profiles [~/.config]."),
    ],
    "FILES": [
        ("/etc/proxytune/profiles", "Site profiles (under --root), searched first."),
        ("~/.config/proxytune/profiles", "The user's profiles, searched next."),
        ("/usr/share/proxytune/profiles", "The shipped profiles; see `proxytune profiles list`."),
        ("/var/lib/proxytune", "The apply journal that rollback reads."),
        ("/run/proxytune", "The host-wide lock of apply and rollback (root's, 0700)."),
        ("/var/cache/proxytune", "Built microbenchmark harnesses (root)."),
    ],
    "EXIT STATUS": [
        ("0", "All good."), ("1", "Drift or findings."), ("2", "Usage or runtime error."), ("130", "Interrupted."),
    ],
}


def load_cli():
    """The checkout as the `proxytune` package, as cli.py registers it when run."""
    sys.path.insert(0, str(REPO))
    if "proxytune" not in sys.modules:
        spec = importlib.machinery.ModuleSpec("proxytune", None, is_package=True)
        spec.submodule_search_locations = [str(REPO)]
        sys.modules["proxytune"] = importlib.util.module_from_spec(spec)
    from proxytune import cli
    return cli


def esc(text: str) -> str:
    """Roff-safe text: backslashes, minus signs, and a leading dot or quote."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line for line in text.split("\n"))


def paragraphs(help_text: str) -> list[str]:
    """click's help paragraphs: a \\b paragraph keeps its lines, the others are filled."""
    out = []
    for para in inspect.cleandoc(help_text or "").split("\n\n"):
        if para.startswith("\b\n"):
            out.append(".nf\n" + esc(para[2:]) + "\n.fi")
        elif para.strip():
            out.append(esc(" ".join(line.strip() for line in para.splitlines())))
    return out


def options(command: click.Command, ctx: click.Context) -> list[str]:
    out = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record:
            out += [".TP", f"\\fB{esc(record[0])}\\fR", esc(record[1])]
    return out


def commands(group: click.Group, ctx: click.Context) -> list[str]:
    out = []
    for name, sub in group.commands.items():
        sub_ctx = click.Context(sub, info_name=name, parent=ctx)
        usage = " ".join(sub.collect_usage_pieces(sub_ctx))
        out += [f'.SS "{esc(sub_ctx.command_path)} {esc(usage)}"', *sum(([p, ".PP"] for p in paragraphs(sub.help)), [])]
        out += options(sub, sub_ctx)
        if isinstance(sub, click.Group):
            out += commands(sub, sub_ctx)
    return out


def manpage() -> str:
    cli = load_cli()
    ctx = click.Context(cli.main, info_name="proxytune")
    summary = cli.main.help.split("\n", 1)[0].rstrip(".")
    lines = [f'.TH PROXYTUNE 8 "" "proxytune {cli.__version__}" "System Administration"',
             ".SH NAME", f"proxytune \\- {esc(summary[0].lower() + summary[1:])}",
             ".SH SYNOPSIS", ".B proxytune", "[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR]...",
             ".SH DESCRIPTION", *sum(([p, ".PP"] for p in paragraphs(cli.main.help)), []),
             ".SH GLOBAL OPTIONS", *options(cli.main, ctx),
             ".SH COMMANDS", *commands(cli.main, ctx)]
    for section, items in EXTRA.items():
        lines.append(f".SH {section}")
        for term, text in items:
            lines += [".TP", f"\\fB{esc(term)}\\fR", esc(text)]
    lines += [".SH SEE ALSO", "sysctl(8), bpftrace(8), perf(1), valgrind(1), fio(1)"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(manpage())

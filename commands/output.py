"""How a command's result reaches the user: errors as one inert line on stderr, --json as
the versioned result envelope, a monitoring textfile to stdout or a file, a bench result
stored and shown."""

import json
import sys
from pathlib import Path

import click

from proxytune.core import console
from proxytune.core.errors import one_line


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


def emit_metrics(text: str, output: Path | None) -> None:
    """The textfile to stdout, or to FILE by the output rule (tune/files.write_output: temp file + rename,
    node_exporter never reads half a file; a directory of root's or ours only, no link followed, nothing of
    the file it replaces read); a file that is there keeps its mode and owner."""
    if output is None:
        click.echo(text, nl=False)
        return
    from proxytune.tune import files
    files.write_output(output, text, keep=True)


def finish_bench(data: dict, name: str, output: Path | None, as_json: bool, show=None) -> None:
    """Store a bench result (at --output, else proxytune-results/NAME-STAMP.json) and print it: the
    JSON, show(data) for a result the report has no section for, else the report's own section.
    Exit 2 when it failed."""
    from proxytune.reports import benchresult
    from proxytune.reports.tables import section_for
    doc, path = benchresult.store(name, data, output)
    if as_json:
        emit_json(doc)
    else:
        if show:
            show(data)
        else:
            console.print_section(section_for(name, data))
        click.echo(f"result: {path}")
    if why := benchresult.failure(data):
        say_error(f"bench {name}: {why}", f"the result ({'JSON above' if as_json else path}) records what failed")
        sys.exit(2)

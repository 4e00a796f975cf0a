"""The terminal: rich tables boxed on a terminal, plain tab-separated rows
otherwise (or as --format says), so awk and cut can read piped output.

Every package prints through console(); a Section (core/sections.py) is
printed by print_section, the same content reports/ writes as HTML and
Markdown.
"""

import re
import sys

from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .errors import CONTROL, one_line
from .sections import Section
from .sections import Table as SectionTable

FORMATS = ("table", "tsv")
_format: str | None = None          # None: tsv when stdout is not a terminal
# a run of what one_line() escapes (C0/C1 controls, line separators, bidi overrides) becomes one space
CONTROL_RUN = re.compile(f"(?:{CONTROL.pattern})+")


def term_text(text, markup: bool = True) -> str:
    """THE way untrusted text (a comm, an exe path, a proxy's config value, a fleet host's answer,
    a result file's string) reaches the terminal: control characters and so escape sequences
    written as escapes (one_line), then, for rich (markup=True), markup escaped so `[/]` is shown
    as written, never parsed. markup=False for click.echo."""
    text = one_line(text)
    return escape(text) if markup else text


def set_format(fmt: str | None) -> None:
    """--format: "table", "tsv", or None to decide by whether stdout is a terminal."""
    global _format
    _format = fmt


def tsv_wanted() -> bool:
    return _format == "tsv" or (_format is None and not sys.stdout.isatty())


def tsv_lines(table: Table) -> list[str]:
    """'# title', the header row, then one row per line; cells as plain text,
    control characters (tabs, newlines) replaced so every row stays one line."""
    def plain(cell) -> str:
        return CONTROL_RUN.sub(" ", plain_text(cell)).strip()
    lines = [f"# {plain(table.title)}"] if table.title else []
    lines.append("\t".join(plain(c.header) for c in table.columns))
    columns = [list(c.cells) for c in table.columns]
    lines += ["\t".join(plain(col[i]) for col in columns) for i in range(table.row_count)]
    return lines


def plain_text(cell) -> str:
    """What a cell or a line of markup shows, without its markup."""
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        try:
            return Text.from_markup(cell, emoji=False).plain
        except MarkupError:         # not markup after all: show it as written
            return cell
    return str(cell)


def comment_lines(obj) -> list[str]:
    """Text beside the rows (titles, summaries, notes) as '# ' lines: piped output stays rows only,
    so `awk -F'\t'` and `grep -v '^#'` see nothing but the table."""
    return [f"# {line}".rstrip() for line in plain_text(obj).split("\n")]


class TsvConsole(Console):
    """A Console that, when tsv_wanted(), prints rich Tables as tab-separated rows and
    everything else as comment lines."""

    def print(self, *objects, **kwargs) -> None:
        if not tsv_wanted():
            return super().print(*objects, **kwargs)
        for o in objects:
            lines = tsv_lines(o) if isinstance(o, Table) else comment_lines(o)
            self.file.write("".join(line + "\n" for line in lines))   # rich would expand tabs


def console() -> Console:
    """No emoji (':squid:' is a setting, not a squid), wide when piped."""
    probe = Console()
    return TsvConsole(highlight=False, emoji=False, width=None if probe.is_terminal else 160)


def say(text: str) -> None:
    """A line of plain text beside a table (shown as written, no markup): a comment line when piped."""
    console().print(Text(text), soft_wrap=True)


def print_rows(title: str, headers: list[str], rows: list[list]) -> None:
    """A plain table of values (escaped: text is shown as written)."""
    t = Table(title=title, title_justify="left")
    for h in headers:
        t.add_column(h)
    for r in rows:
        t.add_row(*(term_text(c) for c in r))
    console().print(t)


STATUS_STYLE = {"met": "green", "drift": "yellow", "n/a": "dim", "waived": "dim", "error": "red", "ok": "green", "warn": "yellow",
                "holds": "green", "reversed": "red", "inconclusive here": "dim"}


def rich_table(table: SectionTable, cell=None) -> Table:
    """A Section's table as a rich Table: cells shown as written (or as `cell(text)` marks them up),
    its status column coloured."""
    t = Table(title=term_text(table.title), title_justify="left")
    for h in table.headers:
        t.add_column(term_text(h), overflow="fold")
    for r in table.rows:
        cells = [(cell or term_text)("-" if c is None else str(c)) for c in r]
        if table.status_col is not None and r[table.status_col] in STATUS_STYLE:
            st = r[table.status_col]
            cells[table.status_col] = f"[{STATUS_STYLE[st]}]{st}[/]"
        t.add_row(*cells)
    return t


def print_section(section: Section, out: Console | None = None) -> None:
    """Title, intro, tables and notes; figures are named (they are in the report)."""
    out = out or console()
    out.print(f"[bold]{term_text(section.title)}[/]")
    if section.intro:
        out.print(f"[dim]{term_text(section.intro)}[/]")
    for table in section.tables:
        out.print(rich_table(table))
    for note in section.notes:
        out.print(f"note: {term_text(note)}")

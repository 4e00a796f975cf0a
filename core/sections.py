"""A result's content as sections of tables, figures and notes: built once
(reports/tables.py, tune/audit.py), then shown on a terminal (core/console.py)
or written as Markdown and HTML (reports/)."""

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list]
    status_col: int | None = None


@dataclass
class Figure:
    """A plot, drawn only when a report writes it (a terminal never needs the PNG)."""
    name: str           # file name in the report directory
    caption: str
    draw: Callable[[], bytes | None]
    _png: bytes | None = field(default=None, repr=False)
    _drawn: bool = field(default=False, repr=False)

    @property
    def png(self) -> bytes | None:
        """The PNG, or None when there was nothing to plot."""
        if not self._drawn:
            self._png, self._drawn = self.draw(), True
        return self._png


@dataclass
class Section:
    title: str
    intro: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def drawn_figures(self) -> list[Figure]:
        """The figures that had something to plot (drawing them now)."""
        return [f for f in self.figures if f.png]

"""A result's content as sections of tables, figures and notes: built once
(reports/tables.py, tune/audit.py), then shown on a terminal (core/console.py)
or written as Markdown and HTML (reports/)."""

from dataclasses import dataclass, field
from typing import Callable

# what a renderer raises on a result that fits the schema but not what it reads (a missing optional
# field, a zero or NaN median, a variant measured at some N only): the part is shown as n/a instead
RENDER_ERRORS = (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, AttributeError, OverflowError)


def unrenderable(e: Exception) -> str:
    """Why a part of a result could not be shown, in one line."""
    return f"missing field {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"


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
            try:
                self._png = self.draw()
            except RENDER_ERRORS:      # a saved result's odd values (all zero: nothing to log-scale)
                self._png = None
            self._drawn = True
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

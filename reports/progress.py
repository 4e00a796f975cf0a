"""The report's progress, section by section, so a person can follow a minute of work.

On a terminal: a live table (rich) of every section, done (with its time), running (with the
step it is on) or left, the time so far and an estimate of what remains (what each section took
on this host's last run, from the report.json last written there, else its measurement's budget;
less what the running one has used). Piped or redirected: one plain line per section as it
finishes, on stderr, so stdout stays the report's own lines.
"""

import sys
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text


class Sections:
    """Tracks sections given as (name, label, budget in s); a context manager around the whole run."""

    def __init__(self, plan: list[tuple[str, str, float]], quiet: bool = False, stream=None):
        self.plan, self.quiet = plan, quiet
        self.stream = stream or sys.stderr
        self.done: dict[str, tuple[float, str]] = {}
        self.running: str | None = None
        self.step = ""
        self.t0 = self.started = time.monotonic()
        self.live = None
        if not quiet and self.stream.isatty():
            self.live = Live(console=Console(file=self.stream), auto_refresh=True, refresh_per_second=4,
                             get_renderable=self._render, transient=False)

    def __enter__(self):
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.live.stop()
        return False

    def begin(self, name: str) -> None:
        self.running, self.step, self.started = name, "", time.monotonic()

    def end(self, name: str, outcome: str) -> None:
        """outcome: "done", or why the section could not run."""
        took = time.monotonic() - self.started
        self.done[name] = (took, outcome)
        self.running = None
        if self.live is None and not self.quiet:
            label = dict((n, lab) for n, lab, _ in self.plan)[name]
            what = f"done in {took:.1f} s" if outcome == "done" else f"not run: {outcome}"
            print(f"proxytune: [{len(self.done)}/{len(self.plan)}] {label}: {what}", file=self.stream, flush=True)

    def on_step(self, description: str, completed: float, total: float | None) -> None:
        self.step = f"{description} ({completed:.0f}/{total:.0f})" if total else description

    def remaining(self) -> float:
        """Budgets of the sections left, plus what the running one has left of its own."""
        left = sum(b for n, _, b in self.plan if n not in self.done and n != self.running)
        if self.running:
            budget = dict((n, b) for n, _, b in self.plan)[self.running]
            left += max(budget - (time.monotonic() - self.started), 0.0)
        return left

    def _render(self):
        t = Table(box=None, show_header=False, pad_edge=False)
        for name, label, budget in self.plan:
            if name in self.done:
                took, outcome = self.done[name]
                mark, state = (Text("✓", "green"), Text(f"{took:.1f} s")) if outcome == "done" else \
                    (Text("–", "yellow"), Text(outcome))
            elif name == self.running:
                mark, state = Text("▶", "cyan"), Text(f"{time.monotonic() - self.started:.0f} s  {self.step}")
            else:
                mark, state = Text("·", "dim"), Text(f"~{budget:.0f} s", "dim")
            t.add_row(mark, Text(label), state)
        elapsed = time.monotonic() - self.t0
        return Group(t, Text(f"{elapsed:.0f} s so far, about {self.remaining():.0f} s left"))

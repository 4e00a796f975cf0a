"""The seed table's verdict rule, stated once: a verdict from an interval, never from one run.

A seed row's effect is a benefit ratio (>= 1: the classic advice still pays here). It is measured
as paired repetitions, A and B interleaved (each round in the reverse order of the one before,
AB BA AB: a drift of the host moves both sides of a pair alike), one ratio per pair. The row carries their median and an interval:

- the range of the pairs' ratios [min, max]: for n pairs it holds the true median ratio with
  probability 1 - 2 * 0.5**n (75 % at 3, 94 % at 5), whatever the noise's shape (order statistics);
- or, for a ratio of two medians each repeated in one process (the microbenchmarks: repetitions,
  not interleaved pairs), the ratio of their intervals, lo_a / hi_b to hi_a / lo_b (it holds when
  both do: >= 87.5 % with 5 repetitions each, of_summary()).

The ratio's axis is cut into the verdicts' ranges by the effect's size against the paper's,
s = ln(ratio) / ln(original):

- reversed: ratio < 1 / (1 + EQUIVALENT): the advice costs more than it saves;
- shrank:   s < 0.5, down to 1 / (1 + EQUIVALENT) (an effect within EQUIVALENT of none has shrunk to nothing);
- holds:    0.5 <= s <= 2;
- grew:     s > 2.

A verdict is printed only when the whole interval lies inside one range, EDGE_MARGIN clear of its
edges: the interval's ends, each moved 10 % outward, still lie in that range. Otherwise the row is
"inconclusive here", with its interval and what would settle it; so is a row of fewer than
MIN_REPS = 5 pairs (windows, or repetitions of each side). One run is an anecdote, and 3 are not
enough either: their range holds the median in 75 % of runs, so a row whose median sits on an
edge is decided, on one side of it or the other, about one run in four, and the verdict follows the run
(2026-11-28: four tables of three reports, every row that moved had 3 pairs and an edge inside
them; docs/BENCHMARKS.md "Verdicts run after run"). The range of 5 holds it in 94 %.
The margin: a report's pairs are taken within seconds, in one phase of the host; its next report's
can sit in another, and a row's median moved by about that much from report to report (the large
file row, x2.06-2.35 over 9 reports on 2-core VMs, +-6.5 %; the noatime and reversed edges' own 10 %
is the same size). An interval within it of an edge was decided on one side of the edge in one
report and inconclusive in the next (2026-11-28, large file x2.09 [1.96, 2.25] shrank between two
reports at x2.15 [2.07, 2.64] and x2.32 [2.10, 2.77], against the edge at x2.43): with the margin
such a row is inconclusive in all of them; more pairs would not move it off the edge.
"""

import math
import statistics

EQUIVALENT = 0.10          # a ratio within 10 % below 1 counts as no effect, not as the advice reversed
EDGE_MARGIN = 0.10         # how far clear of an edge an interval must lie for a verdict: the host's drift
MIN_REPS = 5
SHRANK_BELOW, GREW_ABOVE = 0.5, 2.0
INCONCLUSIVE = "inconclusive here"
SETTLE = "more pairs would settle it (report --full), or a quieter host"


def range_of(ratio: float, original: float) -> str:
    """The verdict whose range holds this one ratio."""
    if ratio < 1 / (1 + EQUIVALENT):
        return "reversed"
    if ratio <= 1:
        return "shrank"
    size = math.log(ratio) / math.log(original)
    return "grew" if size > GREW_ABOVE else "shrank" if size < SHRANK_BELOW else "holds"


def edges(original: float) -> dict[str, float]:
    """The ratios where the verdicts' ranges meet, for this paper's effect."""
    return {"reversed|shrank": 1 / (1 + EQUIVALENT), "shrank|holds": original ** SHRANK_BELOW,
            "holds|grew": original ** GREW_ABOVE}


def order_coverage(n: int) -> float:
    """How often the range of n independent values holds their distribution's median: 1 - 2 * 0.5**n."""
    return 1 - 2 * 0.5 ** n if n > 1 else 0.0


def paired(ratios: list[float], unit: str = "pairs") -> dict | None:
    """The pairs' median and range; None when there is no usable pair. A ratio of 0 (the B side
    served nothing) or infinity (the A side did) is a measurement, at the end of the range; only a
    missing one (None, NaN) is left out."""
    vals = sorted(r for r in ratios if r is not None and not math.isnan(r) and r >= 0)
    if not vals:
        return None
    return {"median": statistics.median(vals), "interval": [vals[0], vals[-1]], "reps": len(vals),
            "coverage": order_coverage(len(vals)), "unit": unit}


def of_summary(a: dict) -> dict | None:
    """A stats.summary() result (repetitions in one process) as a measured value with its interval:
    its ci95, a percentile bootstrap of the median, which with 5 values is [min, max] (a resample's
    median is the minimum 5.8 % of the time, over 2.5 %): then its coverage is the range's,
    1 - 2 * 0.5**n (94 % at 5), not 95 %. Without a ci95 the value has no interval."""
    if not a or not a.get("median") or a["median"] <= 0:
        return None
    n = a.get("n", 1)
    if not a.get("ci95"):
        return {"median": a["median"], "interval": [a["median"]] * 2, "reps": 1, "coverage": 0.0,
                "unit": "repetitions"}
    lo, hi = a["ci95"]
    ranged = [lo, hi] == [a.get("min"), a.get("max")]
    return {"median": a["median"], "interval": [lo, hi], "reps": n,
            "coverage": order_coverage(n) if ranged else 0.95, "unit": "repetitions"}


def quotient(a: dict | None, b: dict | None) -> dict | None:
    """a / b of two measured values: the interval from the extremes of theirs (lo_a / hi_b to hi_a / lo_b),
    which holds whenever both do: at least 1 - (1 - ca) - (1 - cb)."""
    if a is None or b is None or min(b["interval"]) <= 0:
        return None
    return {"median": a["median"] / b["median"], "interval": [a["interval"][0] / b["interval"][1],
                                                              a["interval"][1] / b["interval"][0]],
            "reps": min(a["reps"], b["reps"]), "unit": a.get("unit", "pairs"),
            "coverage": max(0.0, a.get("coverage", 0.0) + b.get("coverage", 0.0) - 1)}


def decide(m: dict | None, original: float, against: str = "then") -> tuple[str, str]:
    """(verdict, why) for a measured ratio `m` (paired() or of_medians()) against the paper's."""
    if m is None:
        return "not measurable here", "no measurement in this run"
    lo, hi = m["interval"]
    spread = f"x{m['median']:.2f} ({interval_text(m)})"
    if m["reps"] < MIN_REPS:
        return INCONCLUSIVE, f"{spread}: a verdict takes {MIN_REPS} at least; {SETTLE}"
    low, high = range_of(lo, original), range_of(hi, original)
    if low != high:
        return INCONCLUSIVE, f"{spread} spans {low} to {high}; {SETTLE}"
    near = _edge_within_margin(lo, hi, original)
    if near:
        return INCONCLUSIVE, (f"{spread} lies within {EDGE_MARGIN:.0%} of the {near[0]} edge (x{near[1]:.2f}), "
                              "less than a row moves from one report to the next; more pairs would not settle it")
    return low, f"{spread} today against x{original:.2f} {against}"


def _edge_within_margin(lo: float, hi: float, original: float) -> tuple[str, float] | None:
    """(edge's name, ratio) of an edge within EDGE_MARGIN of an interval lying in one range; else None."""
    for name, at in edges(original).items():
        if lo / (1 + EDGE_MARGIN) < at <= hi * (1 + EDGE_MARGIN):
            return name.replace("|", " and "), at
    return None


def interval_text(m: dict) -> str:
    lo, hi = m["interval"]
    cover = f", {m['coverage']:.0%} interval" if m.get("coverage") else ""
    unit = m.get("unit", "pairs")
    return f"x{lo:.2f} to x{hi:.2f} over {m['reps']} {unit[:-1] if m['reps'] == 1 else unit}{cover}"

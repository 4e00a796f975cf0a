"""Paired A/B statistics for `probe overhead`: the median of the per-pair
relative differences with a distribution-free confidence interval (the sign
test's order-statistic interval), and an honest verdict when that interval
includes zero. The sign test assumes only that pairs are independent; it
needs no normality, which a shared 2-core VM does not give."""

import math
import statistics

CONFIDENCE = 0.95
CLAIM = 0.9           # below this coverage an interval is not worth a verdict (4 pairs: 87.5 %)


def _coverage(n: int, k: int) -> float:
    """Coverage of [x(k), x(n+1-k)] (1-based order statistics) for the median of n pairs."""
    tail = sum(math.comb(n, i) for i in range(k)) / 2 ** n
    return 1 - 2 * tail


def median_ci(values: list[float], confidence: float = CONFIDENCE) -> dict:
    """Median with the narrowest sign-test interval whose coverage is at least `confidence`.
    With too few pairs to reach it (n <= 5 for 95 %), the widest interval (min, max) and its
    real coverage are returned: the reader sees 93.8 % rather than a claimed 95 %."""
    xs = sorted(values)
    n = len(xs)
    if not n:
        raise ValueError("no pairs")
    k = 1
    while k + 1 <= (n + 1) // 2 and _coverage(n, k + 1) >= confidence:
        k += 1
    return {"median": statistics.median(xs), "ci": [xs[k - 1], xs[n - k]], "confidence": _coverage(n, k),
            "n": n, "method": "sign test (order statistics)"}


def verdict(ci: list[float], confidence: float = CONFIDENCE) -> str:
    """What the interval allows one to say: a cost, a gain, or noise."""
    lo, hi = ci
    if confidence < CLAIM:
        return f"too few pairs for an interval ({confidence:.0%} coverage): run 5 or more --reps"
    if lo > 0:
        return f"costs {lo:+.1%} to {hi:+.1%}"
    if hi < 0:
        return f"cheaper with it attached ({lo:+.1%} to {hi:+.1%}): a load effect, not a saving"
    return f"not separable from noise (interval {lo:+.1%} to {hi:+.1%})"


def clean(rows: list[dict], mode_key: str = "mode") -> list[dict]:
    """The rows of the pairs (same "rep") during which no foreign tracer ran. Decided before
    looking at any figure, so dropping them selects nothing but the host's state."""
    bad = {r["rep"] for r in rows if r.get("foreign_tracers")}
    kept = [r for r in rows if r["rep"] not in bad]
    return kept if {r[mode_key] for r in kept} == {"off", "on"} else []


def pair_ratios(off: list[float], on: list[float]) -> list[float]:
    """on/off - 1 for each interleaved pair (pairs with a missing value are dropped)."""
    return [b / a - 1 for a, b in zip(off, on) if a and b is not None]


def summarise(off: list[float], on: list[float], goal_pair: float = 0.05, goal_median: float = 0.02) -> dict:
    """The overhead as the issue judges it: every pair <= goal_pair, the median <= goal_median."""
    pairs = pair_ratios(off, on)
    m = median_ci(pairs)
    return {"overhead_per_pair": pairs, "overhead": m["median"], "overhead_ci": m["ci"],
            "overhead_ci_confidence": m["confidence"], "overhead_ci_method": m["method"],
            "verdict": verdict(m["ci"], m["confidence"]),
            "goal": {"max_pair": goal_pair, "max_median": goal_median,
                     "met": m["median"] <= goal_median and max(pairs) <= goal_pair,
                     "median_upper_bound_met": m["ci"][1] <= goal_median}}

"""Statistics for repeated measurements: median and spread, a bootstrap
confidence interval for the median, least-squares fits, and the knee and
crossover points the event study reports. Standard library only."""

import random
import statistics


def summary(values: list[float], seed: int = 1) -> dict:
    """median, min, max, relative spread (IQR / median) and a 95% bootstrap CI of the median."""
    vals = sorted(values)
    med = statistics.median(vals)
    q = statistics.quantiles(vals, n=4) if len(vals) >= 2 else [vals[0]] * 3
    rng = random.Random(seed)
    boots = sorted(statistics.median(rng.choices(vals, k=len(vals))) for _ in range(400))
    return {"median": med, "min": vals[0], "max": vals[-1], "n": len(vals),
            "iqr_rel": (q[2] - q[0]) / med if med else 0.0,
            "ci95": [boots[9], boots[389]]}


def linfit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x; returns (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def fit_model(points: list[tuple[int, int, float]]) -> dict:
    """t = a + b*N + c*K by least squares over (N, K, t) points (normal equations, 3x3)."""
    if len({k for _, k, _ in points}) < 2:          # one K only: t = a + b*N
        a, b = linfit([float(n) for n, _, _ in points], [t for _, _, t in points])
        return {"a_ns": a, "b_ns_per_fd": b, "c_ns_per_ready": None}
    rows = [(1.0, float(n), float(k)) for n, k, _ in points]
    ys = [t for _, _, t in points]
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(3)]
    try:
        a, b, c = _solve3(ata, aty)
    except ZeroDivisionError:
        return {"a_ns": None, "b_ns_per_fd": None, "c_ns_per_ready": None}
    return {"a_ns": a, "b_ns_per_fd": b, "c_ns_per_ready": c}


def _solve3(m, v):
    m = [row[:] + [val] for row, val in zip(m, v)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-12:
            raise ZeroDivisionError
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][3] / m[i][i] for i in range(3)]


def knee(ns: list[int], ts: list[float]) -> dict | None:
    """Where the per-descriptor slope changes most: split the curve in two
    linear pieces and keep the split with the smallest squared error."""
    if len(ns) < 5:
        return None
    best = None
    for i in range(2, len(ns) - 2):
        left, right = (ns[:i + 1], ts[:i + 1]), (ns[i:], ts[i:])
        err, slopes = 0.0, []
        for xs, ys in (left, right):
            a, b = linfit(xs, ys)
            err += sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
            slopes.append(b)
        if best is None or err < best["err"]:
            best = {"n": ns[i], "slope_below_ns": slopes[0], "slope_above_ns": slopes[1], "err": err}
    best.pop("err")
    return best


def crossover(ns: list[int], a: list[float], b: list[float]) -> dict:
    """Largest N at which series a is still cheaper than series b, with what the grid shows."""
    below = [n for n, x, y in zip(ns, a, b) if x < y]
    if not below:
        return {"n": None, "note": f"never cheaper at any N measured ({ns[0]}..{ns[-1]})"}
    if len(below) == len(ns):
        return {"n": None, "note": f"cheaper at every N measured ({ns[0]}..{ns[-1]})"}
    return {"n": max(below), "note": f"cheaper up to N = {max(below)}"}

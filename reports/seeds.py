""""The classic results, today": each headline of the reference papers against this run's data.

Every row is computed from the sections measured in this report; the papers'
figures are the only constants here, each quoted with the file it comes from.
A verdict compares today's effect (a ratio >= 1 means the classic advice still
pays) with the original effect, as effect sizes on a log scale, from repetitions
and their interval: the rule is reports/verdicts.py's, stated there once. Each
row names the cells and repetitions it was computed from.
"""

import math
import statistics

from proxytune.core.sections import RENDER_ERRORS, unrenderable

from . import verdicts

# 30% of CPU before, 0.54% after, the rest (70 units) unchanged: 30 / (0.0054 * 70 / 0.9946)
MOGUL_COST_RATIO = 30 / (0.0054 * 70 / (1 - 0.0054))


def row(seed, claim, original, today, measured, original_ratio, reason, cells: str = "", forced=None,
        against="then") -> dict:
    """One seed row: `measured` (reports/verdicts.py: median, interval, pairs) decides the verdict;
    `cells` names what it was computed from."""
    v, why = forced or verdicts.decide(measured, original_ratio, against)
    m = measured or {}
    return {"seed": seed, "claim": claim, "original": original, "today": today,
            "ratio": None if not m else round(m["median"], 3),
            "interval": None if not m else [round(x, 3) for x in m["interval"]],
            "reps": m.get("reps", 0), "unit": m.get("unit", "pairs"), "cells": cells, "verdict": v,
            "reason": f"{why}; {reason}" if reason else why}


def _not_here(seed, claim, original, why) -> dict:
    return row(seed, claim, original, "-", None, 1, "", forced=("not measurable here", why))


def _hot_k1(ev: dict, backend: str, n: int) -> dict | None:
    """The ns-per-call summary of an idle-scan point of bench events (k = 1 ready, hot)."""
    for p in ev.get("idle", []):
        if (p.get("backend"), p.get("n"), p.get("k"), p.get("ready")) == (backend, n, 1, "hot") and p.get("available"):
            return p["ns_per_call"]
    return None


def _growth(ev: dict, backend: str) -> dict | None:
    """A backend's cost per call at its largest N over N=100, with the interval of the two medians."""
    sc = ev.get("scaling", {}).get(backend)
    if not sc:
        return None
    return verdicts.quotient(verdicts.of_summary(_hot_k1(ev, backend, sc["n_large"])),
                             verdicts.of_summary(_hot_k1(ev, backend, sc["n_small"])))


def select_poll(ev: dict | None) -> dict:
    """Cost per call grows with idle descriptors: compare growth of cost with growth of N."""
    claim, seed = "select/poll cost grows with the idle descriptors scanned", "select/poll O(N)"
    original = "comm_select's scan is O(N) in open descriptors (speedier-squid-mogul-comm-select.txt)"
    sc = (ev or {}).get("scaling", {})
    if "poll" not in sc:
        return _not_here(seed, claim, original, "bench events did not run")
    p = sc["poll"]
    n_growth = p["n_large"] / p["n_small"]
    flat = ", ".join(f"{b} x{sc[b]['ratio']:.2f}" for b in ("epoll", "io_uring") if b in sc)
    today = (f"poll x{p['ratio']:.0f}, select x{sc.get('select', {}).get('ratio', float('nan')):.0f} "
             f"for x{n_growth:.0f} descriptors; {flat}")
    cells = f"bench events: poll, 1 ready of N={p['n_small']:,} and of N={p['n_large']:,}, hot"
    return row(seed, claim, original, today, _growth(ev, "poll"), n_growth, flat or "no O(1) mechanism ran", cells,
               against="for a linear scan")


def mogul(fd: dict | None) -> dict:
    claim, seed = "bitmaps cut comm_select's cost by a large constant", "Mogul's comm_select fix"
    original = ("30% -> 0.54% of non-idle CPU (speedier-squid-mogul-comm-select.txt): with the other 70% unchanged, "
                "comm_select itself became x79 cheaper")
    if not fd or not fd.get("points"):
        return _not_here(seed, claim, original, "bench fdscan did not run")
    n = max(p["n"] for p in fd["points"])
    at = {p["variant"]: p for p in fd["points"] if p["n"] == n}
    if 1 not in at or 5 not in at:
        return _not_here(seed, claim, original, "variants 1 and 5 were not both measured")
    v1, v5 = at[1]["ns_per_call"], at[5]["ns_per_call"]
    today = f"variant 1 {v1['median']:,.0f} ns -> variant 5 {v5['median']:,.0f} ns per call at N={n:,}"
    return row(seed, claim, original, today, verdicts.quotient(verdicts.of_summary(v1), verdicts.of_summary(v5)),
               MOGUL_COST_RATIO, f"same scan, cost per call (not share of CPU) at N={n:,}",
               f"bench fdscan: variants 1 and 5 at N={n:,}")


def kqueue(ev: dict | None) -> dict:
    claim, seed = "kqueue beats select under heavy load", "kqueue"
    original = "+8% peak req/s, 400 -> 450 (squid-perf-issues-2002-kqueue-aio-largefile.txt)"
    backends = {b["name"]: b for b in (ev or {}).get("backends", [])}
    kq = backends.get("kqueue")
    sc = (ev or {}).get("scaling", {})
    if kq and kq.get("available") and "kqueue" in sc and "select" in sc:
        return row(seed, claim, original, f"select x{sc['select']['ratio']:.0f}, kqueue x{sc['kqueue']['ratio']:.2f}",
                   verdicts.quotient(_growth(ev, "select"), _growth(ev, "kqueue")), 450 / 400,
                   "growth of cost per call with idle descriptors, select over kqueue",
                   "bench events: select and kqueue, 1 ready of N=100 and of the largest N, hot")
    why = kq["reason"] if kq else "bench events did not run"
    stand_in = ", ".join(f"{b} x{sc[b]['ratio']:.2f}" for b in ("epoll", "io_uring") if b in sc)
    out = _not_here(seed, claim, original, why)
    if stand_in:
        out["today"] = f"in its place on Linux: {stand_in} from N={sc['epoll']['n_small']} to {sc['epoll']['n_large']:,}"
    return out


def _no_pairs(st: dict | None) -> str:
    if not st:
        return "bench storage did not run (it needs root)"
    if "seed_pairs" not in st:
        return "this storage result predates the seed rounds (no seed_pairs): run bench storage again"
    return "bench storage ran without the seed rows' cells (the threads engine on ext4)"


def _pairs_cells(p: dict, reps: int) -> str:
    return (f"bench storage: {p['fs']} {p['engine']}, {p['a']} and {p['b']}, {p['phase']} phase, "
            f"{reps} rounds alternating")


def largefile(st: dict | None) -> dict:
    claim, seed = "one large file with async I/O beats one file per object", "large file vs file per object"
    original = ("60/140 -> 450 req/s (squid-perf-issues-2002...); coss 326 vs ufs 55 xact/s, x5.9 "
                "(squid-definitive-guide-appendix-d-filesystems.txt)")
    p = (st or {}).get("seed_pairs", {}).get("largefile")
    if not p:
        return _not_here(seed, claim, original, _no_pairs(st))
    m = verdicts.paired(p["ratios"])
    a, b = p["a_objects_per_s"], p["b_objects_per_s"]
    today = (f"{p['fs']}/{p['engine']}: file per object {statistics.median(a):,.0f} -> large file "
             f"{statistics.median(b):,.0f} objects/s (medians)")
    fill = (st.get("fill_ratio_largefile_over_ufs") or {}).get(f"{p['fs']}/{p['engine']}")
    return row(seed, claim, original, today, m, 326 / 55,
               "steady hits and misses, large file / file per object" + (f"; fill x{fill:.1f}" if fill else ""),
               _pairs_cells(p, len(p["ratios"])))


def noatime(st: dict | None) -> dict:
    """The verdict from the device work each side's hits asked for, pair by pair (device_work()),
    with the hits/s beside it. noatime skips the atime update and nothing else (fs/inode.c
    touch_atime, atime_needs_update), and the paper's aufs runs were held by their disks (appendix D:
    coss, which spared the disks, reached the no-disk 332/s; aufs 110-168): there the speed-up is what
    the atime writes cost the device. Here the hit phase is CPU-bound (its CPU per hit follows its
    hits/s, 34-55 us from run to run), so hits/s move +-25 % between pairs of the same work and cannot
    show a few per cent (docs/BENCHMARKS.md "noatime"). The work ratio is the larger of operations
    and sectors: an atime write may cost a read's seek or only its bytes. It is no measured speed-up:
    the most noatime can give where the disk holds the proxy, and the row says so. Only the rounds
    with both sides' counts are pairs (fewer than 5: inconclusive); a saved result with none
    (storage.device_work) is judged by its hits/s, as before, and the reason says which."""
    claim, seed = "noatime speeds up a file-per-object cache", "noatime"
    original = "aufs 110 -> 168 xact/s, x1.53 (squid-definitive-guide-appendix-d-filesystems.txt)"
    p = (st or {}).get("seed_pairs", {}).get("noatime")
    if not p:
        return _not_here(seed, claim, original, _no_pairs(st))
    speed = verdicts.paired(p["ratios"])
    today = (f"{p['fs']}/{p['engine']}: {statistics.median(p['a_objects_per_s']):,.0f} -> "
             f"{statistics.median(p['b_objects_per_s']):,.0f} hits/s (medians)")
    cells = _pairs_cells(p, len(p["ratios"]))
    both = [(a, b) for a, b in zip(p.get("a_device") or [], p.get("b_device") or []) if a and b]
    if not both:
        return row(seed, claim, original, today, speed, 168 / 110,
                   "judged by hits/s: this result has no device counts; relatime already limits atime writes "
                   "to one per file", cells)
    work = verdicts.paired([_work_ratio(a, b) for a, b in both])
    per = lambda side, key: statistics.median(d[key] for d in p[side] if d)
    today += (f"; device work per hit {per('a_device', 'sectors_per_object'):.2f} -> "
              f"{per('b_device', 'sectors_per_object'):.2f} sectors, {per('a_device', 'ops_per_object'):.3f} -> "
              f"{per('b_device', 'ops_per_object'):.3f} operations")
    lo, hi = speed["interval"]
    return row(seed, claim, original, today, work, 168 / 110,
               f"judged by device work per hit, relatime / noatime ({len(both)} pairs with counts): the most "
               f"noatime can speed a proxy held by its disk, not a speed measured; relatime writes an atime "
               f"once per file; hits/s x{speed['median']:.2f} (x{lo:.2f} to x{hi:.2f}) follow this host's CPU",
               cells, against="then (xact/s)")


def _work_ratio(a: dict, b: dict) -> float:
    """relatime's device work over noatime's, the larger of operations and sectors; a measure neither
    side moved is even (1); NaN (the pair left out) where noatime alone moved nothing: no ratio."""
    ratios = [1.0 if not a[k] and not b[k] else a[k] / b[k] if b[k] else math.nan
              for k in ("ops_per_object", "sectors_per_object")]
    return math.nan if any(math.isnan(r) for r in ratios) else max(ratios)


def cooper(px: dict | None) -> dict:
    """Served goodput after / before, per round (microbench/hostsettings.capacity: a run that refused
    clients is credited only the share it served); a result of one before and one after (bench proxy
    --compare-profile) is one pair, by its req/s."""
    claim, seed = "host settings double a tuned Squid's throughput", "Cooper's host settings"
    original = "about 50 -> over 100 req/s, x2 (high-performance-squid-tuning-cooper.txt)"
    if not px or not px.get("compare_profile") or len(px.get("stores", [])) < 2:
        return _not_here(seed, claim, original,
                         "the report ran no before/after proxy load (bench proxy --compare-profile)")
    stores = px["stores"]
    rounds = px.get("rounds")
    if rounds and all("capacity" in stores[r["before"]] and "capacity" in stores[r["after"]] for r in rounds):
        return _cooper_rounds(seed, claim, original, px, [(stores[r["before"]], stores[r["after"]]) for r in rounds])
    before, after = px.get("before") or stores[0], px.get("after") or stores[1]
    ratio = after["steady"]["rps"] / before["steady"]["rps"] if before["steady"]["rps"] else None
    today = (f"{before['steady']['rps']:,.0f} -> {after['steady']['rps']:,.0f} req/s, errors "
             f"{before['error_count']:,} -> {after['error_count']:,} with {px['compare_profile']}")
    return row(seed, claim, original, today, verdicts.paired([ratio]), 2.0,
               "same squid and load, before and after the profile", "bench proxy: squid ufs, before then after, once")


def _cooper_rounds(seed, claim, original, px, pairs) -> dict:
    med = lambda side, key: statistics.median(p[side]["capacity"][key] for p in pairs)
    lat = lambda side, q: statistics.median(p[side]["capacity"]["latency_us"][q] for p in pairs) / 1000
    b, a = 0, 1
    today = (f"clients served {med(b, 'served_share'):.0%} -> {med(a, 'served_share'):.0%} of "
             f"{pairs[0][0]['capacity']['clients']:,}; goodput {med(b, 'goodput_rps'):,.0f} -> "
             f"{med(a, 'goodput_rps'):,.0f} responses/s; served goodput {med(b, 'served_goodput_rps'):,.0f} -> "
             f"{med(a, 'served_goodput_rps'):,.0f}; p50 {lat(b, 'p50'):,.1f} -> {lat(a, 'p50'):,.1f} ms, "
             f"p99 {lat(b, 'p99'):,.1f} -> {lat(a, 'p99'):,.1f} ms (medians) with {px['compare_profile']}")
    ratios = [p[a]["capacity"]["served_goodput_rps"] / p[b]["capacity"]["served_goodput_rps"]
              if p[b]["capacity"]["served_goodput_rps"] else None for p in pairs]
    pin = px.get("cpus")
    where = f"squid on CPU {pin['squid']}, the load on {','.join(map(str, pin['load']))}" if pin else "one CPU shared"
    return row(seed, claim, original, today, verdicts.paired(ratios), 2.0,
               "served goodput (successful responses/s x the share of clients served: refused or dropped clients "
               "count against the run that refused them)",
               f"bench proxy: squid ufs, {len(pairs)} rounds of before and after alternating, {where}")


def _split(doc: dict | None) -> dict | None:
    split = (((doc or {}).get("evidence") or {}).get("loop") or {}).get("cpu_split")
    return split if split and split.get("proxy") else None


def cpu_split(doc: dict | None) -> dict:
    """Kernel over the proxy's own cycles; a result with "repeats" (one perf window per run of the
    Cooper pairs) is one value per window."""
    claim, seed = "a proxy's CPU goes mostly to the kernel", "CPU per request split"
    original = "kernel 55-74% of cycles per request, proxy 12-18% (enterprise-proxies-cern-vs-squid-1997.txt)"
    views = [d for d in (doc or {}).get("repeats") or [doc] if _split(d)]
    windows = [_split(d) for d in views]
    if not windows:
        return _not_here(seed, claim, original, "no doctor run watched a proxy in this report (report --with-proxy "
                                                "watches one it starts; --from takes a doctor --json result)")
    ratios = [s.get("kernel", 0.0) / s["proxy"] for s in windows]
    mid = statistics.median(ratios)
    med = min(zip(windows, ratios), key=lambda wr: abs(wr[1] - mid))[0]        # the window nearest the median
    today = ", ".join(f"{k} {v:.0%}" for k, v in sorted(med.items(), key=lambda kv: -kv[1]))
    today = f"{doc['proxy']}: {today}" if doc.get("proxy") else today
    measured = verdicts.paired(ratios, "windows")
    return row(seed, claim, original, today + (" (the median window)" if len(windows) > 1 else ""),
               measured, 0.645 / 0.15,
               "kernel cycles over the proxy's own, against the paper's midpoints 64.5% / 15%" + _by_side(views, ratios),
               f"{len(windows)} perf window(s) on the proxy" + (", one per run of the pairs" if len(windows) > 1 else ""),
               forced=_sides_disagree(views, ratios, measured, 0.645 / 0.15))


def _sides_disagree(views: list[dict], ratios: list[float], measured: dict | None, original: float):
    """(inconclusive, why) when each side's windows all lie in one verdict's range and the sides'
    ranges differ: the split then follows the side (a Squid at its descriptor limit or not), and
    more windows would narrow each side, not join them; else None (verdicts.decide() judges)."""
    sides: dict[str, set[str]] = {}
    for v, r in zip(views, ratios):
        if v.get("label"):
            sides.setdefault(v["label"], set()).add(verdicts.range_of(r, original))
    if len(sides) < 2 or any(len(v) != 1 for v in sides.values()) or len({min(v) for v in sides.values()}) < 2:
        return None
    said = ", ".join(f"{side}: {min(v)}" for side, v in sides.items())
    return verdicts.INCONCLUSIVE, (f"x{measured['median']:.2f} ({verdicts.interval_text(measured)}): the sides "
                                   f"disagree, each window of a side in one range ({said}); more windows would "
                                   "not join them")


def _by_side(views: list[dict], ratios: list[float]) -> str:
    """Each side's windows apart ("; before x3.1-3.6, after x2.4-2.9"), when the windows name their run's side."""
    sides: dict[str, list[float]] = {}
    for v, r in zip(views, ratios):
        if v.get("label"):
            sides.setdefault(v["label"], []).append(r)
    return "".join(f"{'; ' if i == 0 else ', '}{side} x{min(rs):.2f}-{max(rs):.2f}"
                   for i, (side, rs) in enumerate(sides.items()))


def rows(sections: dict) -> list[dict]:
    """One row per headline, from the report's own sections: each measurement's seeds (reports/measurements.py),
    in their rows' order."""
    from .measurements import MEASUREMENTS
    hooks = sorted((entry for m in MEASUREMENTS for entry in m.seeds), key=lambda entry: entry[0])
    return [_guarded(fn, pick(sections)) for _, fn, pick in hooks]


def _guarded(seed, part: dict | None) -> dict:
    """A seed's row; one whose result fits the schema but not this seed (a zero median, a missing
    field) is not measurable here, with why, instead of stopping the report."""
    try:
        return seed(part)
    except RENDER_ERRORS as e:
        return _not_here(seed.__name__, "-", "-", f"the result could not be used: {unrenderable(e)}")

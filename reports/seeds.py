""""The classic results, today": each headline of the reference papers against this run's data.

Every row is computed from the sections measured in this report; the papers'
figures are the only constants here, each quoted with the file it comes from.
A verdict compares today's effect (a ratio >= 1 means the classic advice still
pays) with the original effect, as effect sizes on a log scale (ln of the
ratio), so that x1.2 against x2 (a 20% gain against 100%) and x209 against x79
(both two orders of magnitude) compare as a reader would:

- holds: today's ln(ratio) is within a factor of two of the original's;
- grew / shrank: more than twice / less than half the original's, still beyond noise;
- reversed: the advice now costs more than it saves, beyond noise;
- shrank (to noise): the effect is inside the run's own spread;
- not measurable here: this run has no data for it, with the reason.
"""

import math

from proxytune.core.sections import RENDER_ERRORS, unrenderable

NOISE = 0.10          # relative spread assumed for a median when the data carries none
# 30% of CPU before, 0.54% after, the rest (70 units) unchanged: 30 / (0.0054 * 70 / 0.9946)
MOGUL_COST_RATIO = 30 / (0.0054 * 70 / (1 - 0.0054))


def verdict(today: float | None, original: float, noise: float = NOISE, against: str = "then") -> tuple[str, str]:
    """(verdict, why) for a benefit ratio measured today against the paper's."""
    if today is None or not math.isfinite(today):
        return "not measurable here", "no measurement in this run"
    if today < 1 / (1 + noise):
        return "reversed", f"x{today:.2f}: the classic choice is slower here"
    if today <= 1 + noise:
        return "shrank", f"x{today:.2f} is inside the ±{noise:.0%} noise band of a median"
    size = math.log(today) / math.log(original)
    word = "grew" if size > 2 else "shrank" if size < 0.5 else "holds"
    return word, f"x{today:.2f} today against x{original:.2f} {against}"


def row(seed, claim, original, today, ratio, original_ratio, reason, noise=NOISE, forced=None, against="then",
        among: list[float] | None = None) -> dict:
    """One seed row; `among`: the ratios the median `ratio` was taken from (one per engine). When
    their extremes get different verdicts the row says so: the verdict is the median's, but a
    single repetition per engine can put it on either side of a boundary next time."""
    v, why = forced or verdict(ratio, original_ratio, noise, against)
    if among and not forced:
        lo, hi = verdict(min(among), original_ratio, noise)[0], verdict(max(among), original_ratio, noise)[0]
        if lo != hi:
            why += f"; uncertain: the engines range x{min(among):.2f} to x{max(among):.2f}, which reads {lo} to {hi}"
    return {"seed": seed, "claim": claim, "original": original, "today": today,
            "ratio": None if ratio is None else round(ratio, 3), "verdict": v,
            "reason": f"{why}; {reason}" if reason else why}


def _not_here(seed, claim, original, why) -> dict:
    return row(seed, claim, original, "-", None, 1, "", forced=("not measurable here", why))


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
    return row(seed, claim, original, today, p["ratio"], n_growth, flat or "no O(1) mechanism ran",
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
    ratio = v1["median"] / v5["median"]
    noise = max(v1.get("iqr_rel", NOISE), v5.get("iqr_rel", NOISE), NOISE)
    today = f"variant 1 {v1['median']:,.0f} ns -> variant 5 {v5['median']:,.0f} ns per call at N={n:,}"
    return row(seed, claim, original, today, ratio, MOGUL_COST_RATIO,
               f"same scan, cost per call (not share of CPU) at N={n:,}", noise)


def kqueue(ev: dict | None) -> dict:
    claim, seed = "kqueue beats select under heavy load", "kqueue"
    original = "+8% peak req/s, 400 -> 450 (squid-perf-issues-2002-kqueue-aio-largefile.txt)"
    backends = {b["name"]: b for b in (ev or {}).get("backends", [])}
    kq = backends.get("kqueue")
    sc = (ev or {}).get("scaling", {})
    if kq and kq.get("available") and "kqueue" in sc and "select" in sc:
        ratio = sc["select"]["ratio"] / sc["kqueue"]["ratio"]
        return row(seed, claim, original, f"select x{sc['select']['ratio']:.0f}, kqueue x{sc['kqueue']['ratio']:.2f}",
                   ratio, 450 / 400, "growth of cost per call with idle descriptors, select over kqueue")
    why = kq["reason"] if kq else "bench events did not run"
    stand_in = ", ".join(f"{b} x{sc[b]['ratio']:.2f}" for b in ("epoll", "io_uring") if b in sc)
    out = _not_here(seed, claim, original, why)
    if stand_in:
        out["today"] = f"in its place on Linux: {stand_in} from N={sc['epoll']['n_small']} to {sc['epoll']['n_large']:,}"
    return out


def _combo(st: dict, fs: str, atime: str, store: str, engine: str) -> dict | None:
    for c in st.get("combos", []):
        if (c["fs"], c["atime"], c["store"], c["engine"]) == (fs, atime, store, engine) and c["available"]:
            return c
    return None


def largefile(st: dict | None) -> dict:
    claim, seed = "one large file with async I/O beats one file per object", "large file vs file per object"
    original = ("60/140 -> 450 req/s (squid-perf-issues-2002...); coss 326 vs ufs 55 xact/s, x5.9 "
                "(squid-definitive-guide-appendix-d-filesystems.txt)")
    pairs = []
    for c in (st or {}).get("combos", []):
        if c["store"] == "ufs" and c["atime"] == "relatime" and c["available"]:
            lf = _combo(st, c["fs"], "relatime", "largefile", c["engine"])
            if lf and c.get("steady_objects_per_s") and lf.get("steady_objects_per_s"):
                pairs.append((c["fs"], c["engine"], lf["steady_objects_per_s"] / c["steady_objects_per_s"],
                              lf["fill_objects_per_s"] / c["fill_objects_per_s"]))
    if not pairs:
        return _not_here(seed, claim, original, "bench storage did not run (it needs root)")
    steady = sorted(p[2] for p in pairs)[len(pairs) // 2]
    fill = sorted(p[3] for p in pairs)[len(pairs) // 2]
    today = "; ".join(f"{fs}/{eng}: steady x{s:.1f}, fill x{f:.1f}" for fs, eng, s, f in pairs)
    return row(seed, claim, original, today, steady, 326 / 55,
               f"median over engines, steady (hits and misses) largefile / ufs; fill x{fill:.1f}",
               among=[p[2] for p in pairs])


def noatime(st: dict | None) -> dict:
    claim, seed = "noatime speeds up a file-per-object cache", "noatime"
    original = "aufs 110 -> 168 xact/s, x1.53 (squid-definitive-guide-appendix-d-filesystems.txt)"
    effects = (st or {}).get("noatime_effect", {})
    if not effects:
        return _not_here(seed, claim, original, "bench storage did not run (it needs root)")
    gains = sorted(e["gain"] + 1 for e in effects.values())
    ratio = gains[len(gains) // 2]
    writes = "; ".join(f"{k}: device writes {e['relatime_hit_write_ios']} -> {e['noatime_hit_write_ios']}"
                       for k, e in effects.items())
    today = "; ".join(f"{k}: {e['relatime_hit_objects_per_s']:,.0f} -> {e['noatime_hit_objects_per_s']:,.0f} obj/s"
                      for k, e in effects.items())
    return row(seed, claim, original, today, ratio, 168 / 110,
               f"relatime already limits atime writes to one per file; {writes}", among=gains)


def cooper(px: dict | None) -> dict:
    claim, seed = "host settings double a tuned Squid's throughput", "Cooper's host settings"
    original = "about 50 -> over 100 req/s, x2 (high-performance-squid-tuning-cooper.txt)"
    if not px or not px.get("compare_profile") or len(px.get("stores", [])) < 2:
        return _not_here(seed, claim, original,
                         "the report ran no before/after proxy load (bench proxy --compare-profile)")
    before, after = px["stores"][0], px["stores"][1]
    ratio = after["steady"]["rps"] / before["steady"]["rps"]
    today = (f"{before['steady']['rps']:,.0f} -> {after['steady']['rps']:,.0f} req/s, errors "
             f"{before['error_count']:,} -> {after['error_count']:,} with {px['compare_profile']}")
    fd = [s.get("fd") for s in (before, after)]
    if all(fd):
        today += (f"; Squid's own fd zone at nofile {before['nofile'][0]:,}: {fd[0]['pressure']} "
                  f"(peak {fd[0]['peak']:,}), then {fd[1]['pressure']} (peak {fd[1]['peak']:,})")
    return row(seed, claim, original, today, ratio, 2.0,
               "same squid and load, before and after the profile, one run each (req/s carries no spread)")


def cpu_split(doc: dict | None) -> dict:
    claim, seed = "a proxy's CPU goes mostly to the kernel", "CPU per request split"
    original = "kernel 55-74% of cycles per request, proxy 12-18% (enterprise-proxies-cern-vs-squid-1997.txt)"
    split = (((doc or {}).get("evidence") or {}).get("loop") or {}).get("cpu_split")
    if not split or not split.get("proxy"):
        return _not_here(seed, claim, original, "no doctor run watched a proxy in this report (report --with-proxy "
                                                "watches one it starts; --from takes a doctor --json result)")
    today = ", ".join(f"{k} {v:.0%}" for k, v in sorted(split.items(), key=lambda kv: -kv[1]))
    today = f"{doc['proxy']}: {today}" if doc.get("proxy") else today
    ratio = split.get("kernel", 0.0) / split["proxy"]
    return row(seed, claim, original, today, ratio, 0.645 / 0.15,
               "kernel cycles over the proxy's own, against the paper's midpoints 64.5% / 15%")


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

"""The storage question on real caches: what each store's design predicts,
checked against one `bench proxy --proxy all` run. A prediction compares
two runs of the same result (same host, load and docroot); when either run
is missing the verdict is "n/a", never a guess."""

from proxytune import proxies

# (proxy, store): the design in a few words, from each proxy's module
DESIGN = {(k.kind, store): design for k in proxies.KINDS for store, design in k.store_design.items()}

# (claim, metric, lower run, higher run, factor): holds when lower * factor <= higher
PREDICTIONS = [
    ("one database file needs fewer syscalls per request than one file per object",
     "syscalls_per_request", ("squid", "rock"), ("squid", "ufs"), 1.0),
    ("nginx's file-per-object cache needs more syscalls per request than Traffic Server's one large file",
     "syscalls_per_request", ("trafficserver", "file"), ("nginx", "proxy_cache"), 1.0),
    ("varnish file writes objects to the device, malloc only its shared-memory log",
     "device_write_kb_per_request", ("varnish", "malloc"), ("varnish", "file"), 2.0),
    ("threads take the disk waits off squid's loop: aufs fills faster than ufs",
     "fill_rps", ("squid", "ufs"), ("squid", "aufs"), 1.0),
    ("without a filesystem Traffic Server's raw store fills at least as fast as its file (within 20%)",
     "fill_rps", ("trafficserver", "file"), ("trafficserver", "raw"), 0.8),
]


def _metric(run: dict, metric: str):
    if metric == "fill_rps":
        return run["fill"]["rps"]
    return (run.get("cost") or {}).get(metric)


def verdicts(stores: list[dict]) -> list[dict]:
    """Every prediction with both runs present: the two figures and whether it held."""
    by = {(s.get("proxy", "squid"), s["store"]): s for s in stores}
    out = []
    for claim, metric, low, high, factor in PREDICTIONS:
        a, b = by.get(low), by.get(high)
        va, vb = (_metric(a, metric) if a else None), (_metric(b, metric) if b else None)
        held = None if va is None or vb is None else va * factor <= vb
        out.append({"claim": claim, "metric": metric, "runs": [" ".join(low), " ".join(high)],
                    "values": [va, vb], "held": held})
    return out


def table_rows(stores: list[dict]) -> tuple[list[str], list[list]]:
    """One row per store run with its design, then one per prediction."""
    rows = []
    for s in stores:
        key = (s.get("proxy", "squid"), s["store"])
        c = s.get("cost") or {}
        rows.append([" ".join(key), DESIGN.get(key, "-"), f"{s['fill']['rps']:,.0f}", f"{s['steady']['rps']:,.0f}",
                     "-" if s["hit_ratio"] is None else f"{s['hit_ratio']:.2f}",
                     "-" if c.get("syscalls_per_request") is None else f"{c['syscalls_per_request']:.1f}",
                     "-" if c.get("device_write_kb_per_request") is None else f"{c['device_write_kb_per_request']:.2f}"])
    return ["store", "design", "fill req/s", "steady req/s", "hit ratio", "syscalls/req", "writes KB/req"], rows


def verdict_rows(stores: list[dict]) -> list[list]:
    fmt = lambda v: "-" if v is None else f"{v:,.2f}"
    return [[v["claim"], v["metric"], f"{v['runs'][0]} {fmt(v['values'][0])}", f"{v['runs'][1]} {fmt(v['values'][1])}",
             {True: "held", False: "did not hold", None: "n/a"}[v["held"]]] for v in verdicts(stores)]

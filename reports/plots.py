"""Figures for the report (matplotlib, Agg): each returns PNG bytes, or None when there is
nothing to plot. matplotlib is optional (the wheel's `report` extra, a Recommends of the
.deb): without it every figure is None and the report says so in one line (MISSING)."""

import functools
import io

MISSING = ("plots left out: matplotlib is not installed "
           "(apt install python3-matplotlib, or pipx inject proxytune matplotlib)")

STYLE = {"select": "#d62728", "poll": "#ff7f0e", "epoll": "#2ca02c", "io_uring": "#1f77b4",
         "io_uring-multishot": "#9467bd", "kqueue": "#8c564b"}


@functools.cache
def _pyplot():
    """matplotlib.pyplot with the Agg backend, imported on the first figure (a `tune check` never pays for it)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


@functools.cache
def available() -> bool:
    try:
        _pyplot()
    except ImportError:
        return False
    return True


def _figure(draw):
    """A figure function that draws nothing (None) when matplotlib is missing."""
    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        return draw(*args, **kwargs) if available() else None
    return wrapper


def _subplots(*args, **kwargs):
    return _pyplot().subplots(*args, **kwargs)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    _pyplot().close(fig)
    return buf.getvalue()


@_figure
def events_cost(idle: list[dict], ready: str = "hot") -> bytes | None:
    """Cost per call against idle descriptors, log-log, one line per mechanism (K = 1)."""
    pts = [p for p in idle if p["available"] and p["ready"] == ready and p["k"] == 1]
    if not pts:
        return None
    fig, ax = _subplots(figsize=(7, 4.2))
    for be in sorted({p["backend"] for p in pts}):
        mine = sorted((p for p in pts if p["backend"] == be), key=lambda p: p["n"])
        ns = [p["n"] for p in mine]
        med = [p["ns_per_call"]["median"] for p in mine]
        lo = [p["ns_per_call"]["median"] - p["ns_per_call"]["min"] for p in mine]
        hi = [p["ns_per_call"]["max"] - p["ns_per_call"]["median"] for p in mine]
        ax.errorbar(ns, med, yerr=[lo, hi], marker="o", ms=4, capsize=2, label=be, color=STYLE.get(be))
    ax.set(xscale="log", yscale="log", xlabel="idle descriptors watched (N)", ylabel="ns per wait call",
           title=f"Cost of one wait, 1 ready ({ready}); bars: min..max of repetitions")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _png(fig)


@_figure
def events_batching(load: list[dict]) -> bytes | None:
    if not load:
        return None
    fig, ax = _subplots(figsize=(7, 4.2))
    for be in sorted({l["backend"] for l in load}):
        mine = sorted((l for l in load if l["backend"] == be), key=lambda l: l["offered_per_s"])
        ax.plot([l["offered_per_s"] for l in mine], [l["events_per_call"] for l in mine], marker="o",
                label=be, color=STYLE.get(be))
    ax.set(yscale="log", xlabel="offered events per second (20 us of work each)", ylabel="events per wait call",
           title="Batching under load (Mogul): a busy loop amortises each call")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _png(fig)


@_figure
def fdscan(points: list[dict], misses: list[dict], names: dict) -> bytes | None:
    if not points:
        return None
    fig, (ax, bx) = _subplots(1, 2, figsize=(10, 4.2))
    for v in sorted({p["variant"] for p in points}):
        mine = sorted((p for p in points if p["variant"] == v), key=lambda p: p["n"])
        ax.plot([p["n"] for p in mine], [p["ns_per_call"]["median"] for p in mine], marker="o", label=f"{v}")
    ax.set(xscale="log", yscale="log", xlabel="fd table entries (N)", ylabel="ns per call",
           title="comm_select variants: cost per call")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="variant")
    if misses:
        vs = [m["variant"] for m in misses]
        bars = bx.bar([str(v) for v in vs], [max(m["d1_misses_per_call"], 0.5) for m in misses], color="#1f77b4")
        bx.bar_label(bars, labels=[f"{m['d1_misses_per_call']:,.0f}" for m in misses])   # the real value, 0 included
        bx.set(yscale="log", xlabel="variant", ylabel="D1 misses per call (0 drawn at 0.5)",
               title=f"D1 misses per call at N={misses[0]['n']}")
        bx.grid(True, axis="y", which="both", alpha=0.3)
    else:
        bx.axis("off")
    return _png(fig)


ENGINE_COLORS = {"sync": "#7f7f7f", "threads": "#ff7f0e", "posix-aio": "#9467bd", "io_uring": "#1f77b4"}


@_figure
def storage_throughput(combos: list[dict], fs: str = "ext4", atime: str = "relatime") -> bytes | None:
    """Objects per second by store and engine, fill and steady side by side."""
    rows = [c for c in combos if c["available"] and ((c["fs"] == fs and c["atime"] == atime) or c["store"] == "rawdev")]
    if not rows:
        return None
    fig, axes = _subplots(1, 2, figsize=(10, 4.2), sharey=False)
    stores = [s for s in ("ufs", "largefile", "rawdev") if any(c["store"] == s for c in rows)]
    engines = [e for e in ENGINE_COLORS if any(c["engine"] == e for c in rows)]
    width = 0.8 / len(engines)
    for ax, phase in zip(axes, ("fill", "steady")):
        for i, eng in enumerate(engines):
            vals = [next((c[f"{phase}_objects_per_s"] or 0 for c in rows if c["store"] == s and c["engine"] == eng), 0)
                    for s in stores]
            ax.bar([j + i * width for j in range(len(stores))], vals, width, label=eng, color=ENGINE_COLORS[eng])
        ax.set_xticks([j + width * (len(engines) - 1) / 2 for j in range(len(stores))], stores)
        ax.set(ylabel="objects per second", title=f"{phase} ({fs}, {atime}; rawdev: O_DIRECT)")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(title="engine")
    return _png(fig)


@_figure
def storage_latency(combos: list[dict], phase: str = "steady") -> bytes | None:
    """p50 / p99 / p99.9 of I/O operations per store and engine (log scale)."""
    rows = [c for c in combos if c["available"] and c.get(f"{phase}_latency_us") and c["atime"] in ("relatime", "-")]
    if not rows:
        return None
    fig, ax = _subplots(figsize=(10, 4.2))
    labels = [f"{c['fs']}\n{c['store']}\n{c['engine']}" for c in rows]
    for q, marker in (("p50", "o"), ("p99", "s"), ("p999", "^")):
        ax.scatter(range(len(rows)), [c[f"{phase}_latency_us"][q] for c in rows], marker=marker, label=q)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set(yscale="log", ylabel="us per I/O operation", title=f"{phase} phase: latency of each I/O operation")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend()
    return _png(fig)


@_figure
def storage_fs_matrix(combos: list[dict]) -> bytes | None:
    """Today's Table D-1: ufs and largefile objects/s per filesystem, relatime vs noatime (the sync
    engine; the quick report's seed cells have the threads engine alone)."""
    ran = [c for c in combos if c["available"] and c["fs"] != "raw"]
    engine = "sync" if any(c["engine"] == "sync" for c in ran) else (ran[0]["engine"] if ran else None)
    rows = [c for c in ran if c["engine"] == engine]
    fss = sorted({c["fs"] for c in rows})
    if not fss:
        return None
    fig, axes = _subplots(1, 2, figsize=(10, 4.2))
    for ax, store in zip(axes, ("ufs", "largefile")):
        for i, atime in enumerate(("relatime", "noatime")):
            vals = [next((c["steady_objects_per_s"] for c in rows if c["fs"] == fs and c["store"] == store
                          and c["atime"] == atime), 0) or 0 for fs in fss]
            ax.bar([j + i * 0.4 for j in range(len(fss))], vals, 0.4, label=atime)
        ax.set_xticks([j + 0.2 for j in range(len(fss))], fss)
        ax.set(ylabel="steady objects per second", title=f"{store}, {engine} engine, by filesystem")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend()
    return _png(fig)


@_figure
def proxy_bars(stores: list[dict], labels: list[str]) -> bytes | None:
    """Steady throughput and failed requests per proxy run (proxy and store, or before/after a profile)."""
    if not stores:
        return None
    fig, (a1, a2) = _subplots(1, 2, figsize=(max(10, 1.6 * len(stores)), 3.8))
    names = [f"{lab or s.get('proxy', 'squid')}\n{s['store']}" for lab, s in zip(labels, stores)]
    a1.bar(names, [s["steady"]["rps"] for s in stores], color="#1f77b4")
    for i, s in enumerate(stores):
        if s["hit_ratio"] is not None:
            a1.annotate(f"hits {s['hit_ratio']:.0%}", (i, s["steady"]["rps"]), ha="center", va="bottom", fontsize=8)
    a1.set(ylabel="requests per second (steady)", title="throughput")
    a2.bar(names, [s["error_count"] for s in stores], color="#d62728")
    a2.set(ylabel="failed requests and dropped clients", title="errors")
    for ax in (a1, a2):
        ax.grid(True, axis="y", alpha=0.3)
    return _png(fig)

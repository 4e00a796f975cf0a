"""Figures for the report (matplotlib, Agg): each returns PNG bytes."""

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"select": "#d62728", "poll": "#ff7f0e", "epoll": "#2ca02c", "io_uring": "#1f77b4",
         "io_uring-multishot": "#9467bd", "kqueue": "#8c564b"}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def events_cost(idle: list[dict], ready: str = "hot") -> bytes | None:
    """Cost per call against idle descriptors, log-log, one line per mechanism (K = 1)."""
    pts = [p for p in idle if p["available"] and p["ready"] == ready and p["k"] == 1]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
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


def events_batching(load: list[dict]) -> bytes | None:
    if not load:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for be in sorted({l["backend"] for l in load}):
        mine = sorted((l for l in load if l["backend"] == be), key=lambda l: l["offered_per_s"])
        ax.plot([l["offered_per_s"] for l in mine], [l["events_per_call"] for l in mine], marker="o",
                label=be, color=STYLE.get(be))
    ax.set(yscale="log", xlabel="offered events per second (20 us of work each)", ylabel="events per wait call",
           title="Batching under load (Mogul): a busy loop amortises each call")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _png(fig)


def fdscan(points: list[dict], misses: list[dict], names: dict) -> bytes | None:
    if not points:
        return None
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4.2))
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

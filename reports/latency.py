"""Where a load's latency went, when the load generator's and the proxy's own clocks disagree.

wrk times a request from writing it to reading the whole reply; Squid's access.log `elapsed`
starts when Squid reads the request and ends when it has written the reply. What lies between the
two clocks is outside the proxy's: the request waiting in its socket's receive queue until the
proxy's event loop reaches that connection (a queue inside the proxy that its own clock does not
see), a new connection in the accept queue, and the reply's bytes in flight to the client. Where
they disagree by more than GAP, the report says so with the doctor's time budget of the run when
it has one (probes/budget.py: its parts say which of those queues held the difference), and
otherwise says the difference is unexplained, naming what would explain it.
"""

GAP = 2.0                      # the clocks disagree beyond this factor (issue 31 item 3)


def gap(store: dict) -> dict | None:
    """wrk's p50 against the proxy's own p50 (ms), or None when either clock is missing."""
    wrk = ((store.get("steady") or {}).get("latency_us") or {}).get("p50")
    own = (store.get("service_ms") or {}).get("p50")
    if wrk is None or own is None:
        return None
    wrk_ms = wrk / 1000
    # Squid logs whole milliseconds: a p50 of 0 is under 1 ms, so compare against 1 ms, a lower bound of the gap
    return {"wrk_p50_ms": round(wrk_ms, 2), "proxy_p50_ms": own, "ratio": round(wrk_ms / max(own, 1.0), 1),
            "diff_ms": round(wrk_ms - own, 2)}


def _mean_gap(store: dict) -> float | None:
    """wrk's mean minus Squid's mean (ms): what the budget's parts, means per request, are set against."""
    wrk = ((store.get("steady") or {}).get("latency_us") or {}).get("mean")
    own = (store.get("service_ms") or {}).get("mean")
    return None if wrk is None or own is None else wrk / 1000 - own


def explain(store: dict, label: str) -> str | None:
    """One note when the clocks disagree beyond GAP; None when they agree or one is missing."""
    g = gap(store)
    if g is None or g["ratio"] <= GAP:
        return None
    head = (f"{label}: wrk's p50 {g['wrk_p50_ms']:,.1f} ms against Squid's own {g['proxy_p50_ms']:,.0f} ms "
            f"(access.log elapsed), x{g['ratio']:,.1f}: {g['diff_ms']:,.1f} ms of each request is outside Squid's clock")
    b = store.get("budget")
    if not b or not b.get("parts"):
        why = store.get("budget_unavailable") or "this run had no time budget (the report takes one on its warm-up run, watched by the doctor)"
        return head + f"; unexplained here: {why}"
    known = {k: p["ms"] for k, p in b["parts"].items() if p.get("measurable") and p.get("ms") is not None}
    outside = {k: v for k, v in known.items() if k in ("accept_queue", "proxy_queue")}
    if not outside:
        return head + "; unexplained: the time budget measured neither the accept queue nor a queue inside Squid"
    said = ", ".join(f"{k.replace('_', ' ')} {v:,.1f} ms" for k, v in sorted(outside.items(), key=lambda kv: -kv[1]))
    mean_gap = _mean_gap(store)
    if not mean_gap or mean_gap <= 0:
        return head + f"; the time budget holds {said} a request (means), set against no mean difference"
    share = sum(outside.values()) / mean_gap
    return head + (f"; the time budget holds {said} a request (means): {share:.0%} of the mean difference, "
                   f"{mean_gap:,.1f} ms") + ("" if share >= 0.5 else "; the rest is unexplained")


def notes(stores: list[dict], labels: list[str]) -> list[str]:
    """The latency notes of a bench's runs: each watched run's own (explain()), and one line for the
    runs nobody watched whose clocks disagree too (the doctor watches one run of a report's series)."""
    out, unwatched = [], []
    for lab, s in zip(labels, stores):
        if not s.get("budget") and not s.get("budget_unavailable"):
            g = gap(s)
            if g and g["ratio"] > GAP:
                unwatched.append(f"{lab or s['store']} x{g['ratio']:,.1f}")
        elif n := explain(s, lab or s["store"]):
            out.append(n)
    if unwatched:
        out.append(f"wrk's p50 against Squid's own, runs without a time budget: {', '.join(unwatched)}"
                   + ("; the watched run above says where its own gap went" if out else
                      "; unexplained here: no run of this result had a time budget"))
    return out

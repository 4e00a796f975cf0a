"""Where an average request's time goes in the doctor's window: the time
budget. Pure over the evidence dict (doctor.gather), so a recorded window
replays without root or proxy.

Five parts (names fixed with the proxy modules, /work/notes/budget-
interface.md): accept_queue, proxy_queue, origin_connect,
origin_first_byte, proxy_self. Each says what measured it and how
precisely; a part nothing could measure is "not measurable here" with why,
never 0.

Mechanisms, cheapest that answers first (the doctor's cost per request
stays under 1 %: no syscall tracepoint, no per-packet probe):
- Little's law (L = λW, any arrival and service distribution): the mean
  number of the proxy's sockets found in a state at connsample's ticks
  (sock_diag TCP_INFO, probes/inflight.py), divided by the request rate,
  is the mean time per request spent in that state. Accept queue: the
  listeners' Recv-Q; awaiting the origin: upstream sockets whose request
  is unanswered; ready data not read: sockets with Recv-Q > 0.
- Connects: sock:inet_sock_set_state SYN_SENT -> ESTABLISHED per socket
  (probes/budget.bt): every connect of the window, exactly.
- The proxy's CPU and run-queue wait: /proc/PID/task/*/schedstat.
- The proxy's own clocks where it has them (its module's time_parts:
  HAProxy qtime/ctime/rtime, Varnish VSL timestamps, Squid's log, Traffic
  Server milestones). A proxy's upstream time is measured by its own loop:
  it includes the time the origin's answer sat in the socket before the
  loop read it. The kernel sees that time (origin data not read), so it is
  taken out of the proxy's figure and put where it belongs, proxy_self.

The request rate λ: the proxy's own request counter in the window when its
module reads one, else the kernel's: data segments its client sockets
received (one per request when a request fits in one segment, as GETs do),
plus connections that came and went between two ticks (each carried at
least one request).
"""

import statistics

from proxytune import proxies as kinds

PARTS = ("accept_queue", "proxy_queue", "origin_connect", "origin_first_byte", "proxy_self")
# A part is the budget's dominant part when it holds more than half of the total: more than all the
# other parts together, so no change elsewhere can save as much as halving it.
DOMINANT_SHARE = 0.5
# The total agrees with another clock of the same requests when within this factor (the issue's ±30 %).
AGREES_WITHIN = 0.30


def _part(ms, mechanism: str, precision: str, samples=None, population: str = "every request", **more) -> dict:
    """A part the budget measured itself; `source` is its mechanism in a few words (for the tables)."""
    return {"ms": None if ms is None else round(ms, 3), "p50_ms": more.pop("p50_ms", None),
            "p99_ms": more.pop("p99_ms", None), "samples": samples, "population": population,
            "mechanism": mechanism, "precision": precision, "measurable": ms is not None, **more}


def unmeasurable(why: str, mechanism: str = "none") -> dict:
    return {"ms": None, "p50_ms": None, "p99_ms": None, "samples": None, "population": "every request",
            "mechanism": mechanism, "precision": "", "measurable": False, "why": why}


def origin_key(bpf_key: str) -> str:
    """bpftrace's "IP,PORT" map key as "IP:PORT" ("[v6]:PORT"), the form ss and the proxy modules use; a
    v4-mapped address of a v6 socket in its v4 form, as inflight.origin_of keys the sampled sockets."""
    addr, _, port = str(bpf_key).rpartition(",")
    if addr.startswith("::ffff:") and "." in addr:
        addr = addr[7:]
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _own(ev: dict) -> tuple[dict, dict]:
    """(time_parts result, config origins) of the watched proxy's module; empty when it has none."""
    p = ev.get("proxy") or {}
    kind = kinds.by_kind(p.get("kind")) if p.get("kind") else None
    parts = getattr(kind, "time_parts", None)
    names = getattr(kind, "origins", None)
    own = parts(p) if parts and p.get("timing") is not None else {}
    return own or {}, (names(p) if names else {}) or {}


def requests(ev: dict, own: dict) -> dict:
    """The window's request count and rate: the proxy's own counter, else the kernel's."""
    w = ev.get("window_s") or 0
    n = ((own.get("requests") or {}).get("n"))
    if isinstance(n, int) and n >= 0:
        return {"n": n, "per_s": n / w if w else None, "source": own["requests"].get("source", "the proxy's own count")}
    n = kernel_requests(ev)
    if n is None:
        return {"n": None, "per_s": None, "source": "none: no request counter of the proxy, and no client socket "
                                                    "sampled"}
    return {"n": n, "per_s": n / w if w else None,
            "source": "kernel: data segments received on its client sockets (sock_diag data_segs_in, one per "
                      "request that fits in a segment) plus connections opened and closed between two ticks"}


def kernel_requests(ev: dict) -> int | None:
    """Requests as the window's ticks saw them arrive: data segments in on the client sockets, plus the
    connections established between two ticks (budget.bt's accepts less the sockets born in the window)."""
    seen = (((ev.get("conns") or {}).get("flight") or {}).get("clients"))
    if not seen:
        return None
    new = sum((ev.get("bpf") or {}).get("@bt_acc", {}).values()) if "@bt_acc" in (ev.get("bpf") or {}) else 0
    # connections still in an accept queue at the last tick that were not there at the first arrived in the
    # window but carried no served request
    q = ((ev.get("conns") or {}).get("flight") or {}).get("unaccepted") or {}
    waiting = sum((q.get("at_last_tick") or {}).values()) - sum((q.get("through_every_tick") or {}).values())
    return seen["data_segments_in"] + max(0, new - seen["sockets_born_in_window"] - max(0, waiting))


def _little(total_sum: float, ticks: int, rate: float | None) -> float | None:
    """Mean time in a state per request (ms) from the summed counts over the ticks and the request rate."""
    if not ticks or not rate:
        return None
    return total_sum / ticks / rate * 1000


def _resolution(ticks: int, rate: float | None) -> float | None:
    """One socket seen in one tick, as ms per request: the smallest non-zero Little's-law figure."""
    return round(1000 / ticks / rate, 3) if ticks and rate else None


def _tick_uncertainty(per_tick, rate: float | None) -> float | None:
    """Twice the standard error of the per-tick mean, as ms per request. Requests arrive in bursts
    (a load generator's connections fall into step; a thread serves several at once), so the sockets one
    tick sees are not independent: 6 sockets over 9 ticks can be two ticks that each fell into a burst of 3
    (a fast varnish, CI 2026-11-27: 8.4 ms 'unread' against a 0.7 ms request). The spread between ticks says
    how well the mean is known; 'one socket in one tick' (the resolution) does not."""
    counts = [c for c in per_tick or [] if isinstance(c, int) and not isinstance(c, bool) and c >= 0]
    if len(counts) < 2 or not rate:
        return None
    return round(2 * statistics.stdev(counts) / len(counts) ** 0.5 / rate * 1000, 3)


def _little_precision(ticks: int, rate: float | None) -> str:
    res = _resolution(ticks, rate)
    return (f"mean over {ticks} ticks of ~0.25 s; resolution {res} ms per request (one socket in one tick); "
            "a state shorter than the gap between ticks is seen in proportion to its length") if res else ""


def starved(ev: dict) -> dict[str, dict]:
    """Connections that waited in one of the proxy's accept queues through the whole window: seen at every
    tick (>= 2) as the same established socket that no process holds (inflight.Tally._unaccepted). Little's
    law needs its queue to flow: these clients complete no request (a Varnish pool with queued sessions does
    not run its acceptor: cache_pool.c; a stopped worker's reuseport socket), so their time is no request's;
    they are counted apart, not averaged in."""
    flight = (ev.get("conns") or {}).get("flight") or {}
    seen = flight.get("unaccepted") or {}
    if (flight.get("ticks") or 0) < 2:
        return {}
    last, held = seen.get("at_last_tick") or {}, seen.get("at_last_tick_ticks") or {}
    ticks = flight["ticks"]
    # on such a port the queue is stalled: those that joined it in the window and were still there at the
    # end were not served either, and their ticks come out of the mean with the others'
    return {str(port): {"whole_window": n, "at_the_end": last.get(port, n), "queued_ticks": held.get(port, n * ticks)}
            for port, n in (seen.get("through_every_tick") or {}).items() if n > 0}


def _starved_part(stuck: dict, ticks: int, rate: float | None, w: float) -> dict:
    """The budget's note on connections never accepted (empty when none)."""
    if not stuck:
        return {}
    # what Little's law would have averaged in: the finding's impact, in ms per request
    little = _little(sum(s["whole_window"] for s in stuck.values()) * ticks, ticks, rate) if rate else None
    return {"starved": {"connections": sum(s["at_the_end"] for s in stuck.values()),
                        "whole_window": sum(s["whole_window"] for s in stuck.values()),
                        "by_port": {p: s["whole_window"] for p, s in stuck.items()}, "window_s": round(w, 3),
                        "little_ms": round(little or 0.0, 3),
                        "note": "in the accept queue at every tick, never accepted (and on the same listeners "
                                "those still queued at the end): no request of theirs was served in the window, so "
                                "they are not in the mean per request"}}


def accept_queue(ev: dict, req: dict) -> dict:
    flight = (ev.get("conns") or {}).get("flight") or {}
    ticks, rate = flight.get("ticks") or 0, req["per_s"]
    if not ticks:
        return unmeasurable("the listeners were not sampled (no sock_diag reading in the window)")
    queued = flight.get("accept_queued_sum") or {}
    stuck = starved(ev)
    w = ev.get("window_s") or 0
    more = _starved_part(stuck, ticks, rate, w)
    if not rate:          # nothing served: a stalled proxy's clients can still be waiting, never accepted
        return {**unmeasurable("no request rate (no request counted in the window)"), **more}
    # the connections that waited through every tick were in the queue at each: their part of the sums
    ms = _little(sum(queued.values()) - sum(s["queued_ticks"] for s in stuck.values()), ticks, rate)
    new = (ev.get("bpf") or {}).get("@bt_acc") or {}
    per_port = {port: {"mean_queued": round(n / ticks, 3)} for port, n in queued.items()}
    for port, n in new.items():
        per_port.setdefault(str(port), {})["connections_per_s"] = round(n / w, 1) if w else None
    for port, s in stuck.items():
        per_port.setdefault(str(port), {})["never_accepted"] = s["whole_window"]
    return _part(max(0.0, ms) if ms is not None else None,
                 "Little's law: each listener's accept queue (Recv-Q of its LISTEN socket, sock_diag) at "
                 "every tick, mean length / the request rate", _little_precision(ticks, rate), ticks,
                 by_port=per_port, resolution_ms=_resolution(ticks, rate),
                 source="kernel: listeners' accept queues sampled", **more)


def proxy_queue(own: dict, kind: str | None) -> dict:
    got = (own.get("parts") or {}).get("proxy_queue")
    if got:
        return got
    why = (f"{kind} reports no queue figures that its module reads" if kind else
           "not a proxy the doctor knows: a queue inside it is invisible to the kernel")
    return unmeasurable(why)


def origin_connect(ev: dict, req: dict, own: dict, names: dict) -> dict:
    b = ev.get("bpf") or {}
    if "@bt_conn_ns" not in b and "budget" not in (ev.get("scripts") or []):
        why = (ev.get("skipped_scripts") or {}).get("budget", "budget.bt did not run")
        return unmeasurable(f"connects not traced: {why}")
    n = req["n"]
    if not n:
        return unmeasurable("no request counted in the window")
    by = {}
    total_ns = 0.0
    for key, st in (b.get("@bt_conn_ns") or {}).items():
        o = origin_key(key)
        total_ns += st.get("total", 0)
        by[o] = {**names.get(o, {}), "ms": round(st.get("average", 0) / 1e6, 3), "connects": st.get("count", 0)}
    for key, fails in (b.get("@bt_conn_fail") or {}).items():
        by.setdefault(origin_key(key), {**names.get(origin_key(key), {})})["failed_connects"] = fails
    connects = sum(v.get("connects", 0) for v in by.values())
    p50, p99 = hist_quantiles(b.get("@bt_conn_us"), (0.5, 0.99))
    part = _part(total_ns / 1e6 / n, "sock:inet_sock_set_state: every connect of the proxy, SYN_SENT (its "
                 "task) -> ESTABLISHED (matched by socket); summed, / the requests", "exact per connect "
                 "(kernel clock); per request it is spread over all requests (connection reuse lowers it)",
                 connects, p50_ms=p50, p99_ms=p99, by_origin=by, per_connect="p50/p99 are per connect",
                 source="kernel: every connect traced")
    theirs = (own.get("parts") or {}).get("origin_connect")
    if theirs and theirs.get("measurable"):
        part["proxy_says"] = {"ms": theirs.get("ms"), "mechanism": theirs.get("mechanism")}
    return part


def _origin_flight(ev: dict) -> tuple[dict, int]:
    flight = (ev.get("conns") or {}).get("flight") or {}
    return flight.get("origins") or {}, flight.get("ticks") or 0


def origin_unread_ms(ev: dict, req: dict) -> float | None:
    origins, ticks = _origin_flight(ev)
    return _little(sum(o.get("unread", 0) for o in origins.values()), ticks, req["per_s"])


def _kernel_first_byte(ev: dict, req: dict, names: dict) -> dict | None:
    """Little's law on the upstream sockets awaiting their origin: the awaiting ones give the lower bound,
    with the ambiguous ones (inflight.ambiguous) the upper one; per origin too."""
    origins, ticks = _origin_flight(ev)
    rate = req["per_s"]
    if not (ticks and rate):
        return None
    lo = lambda v: _little(v.get("awaiting", 0), ticks, rate)
    hi = lambda v: _little(v.get("awaiting", 0) + v.get("ambiguous", 0), ticks, rate)
    by = {o: {**names.get(o, {}), "ms": round(lo(v), 3), "ms_upper": round(hi(v), 3),
              "mean_awaiting": round(v.get("awaiting", 0) / ticks, 3)} for o, v in origins.items()}
    ties = ((ev.get("conns") or {}).get("flight") or {}).get("awaiting_in_one_jiffy", 0)
    low = sum(lo(v) for v in origins.values())
    high = sum(hi(v) for v in origins.values())
    return _part(low, "Little's law: upstream sockets awaiting their origin's first byte at every tick (sock_diag "
                      "TCP_INFO: data sent, none received since; Recv-Q 0), mean count / the request rate",
                 _little_precision(ticks, rate) + (f"; between {low:.1f} and {high:.1f} ms: sockets that sent, "
                                                   "received and were acknowledged within one jiffy may be awaiting "
                                                   "or idle" if high > low else ""),
                 ticks, by_origin=by, resolution_ms=_resolution(ticks, rate), ms_upper=round(high, 3),
                 awaiting_in_one_jiffy=ties, source="kernel: upstream sockets sampled")


def _traced_first_byte(ev: dict, req: dict, names: dict) -> dict | None:
    """origin_wait.bt's exchanges (attached when the sampled sockets were ambiguous): their mean wait times
    the exchanges per request. bpftrace's maps span its attach to its exit, not the window (and a proxy's
    own count may be of another window), so the exchanges per request come from the window's ticks: data
    segments out on the upstream sockets over those in on the client sockets (one segment each for a
    request that fits in one); else the traced starts over the requests."""
    b = ev.get("bpf") or {}
    if "origin_wait" not in (ev.get("scripts") or []) or not req["n"]:
        return None
    waits = {origin_key(k): st for k, st in (b.get("@ow_ns") or {}).items() if st.get("count")}
    done = sum(st["count"] for st in waits.values())
    if not done:
        return None
    per_req, how = _exchanges_per_request(ev, req, b.get("@ow_starts") or done)
    by = {o: {**names.get(o, {}), "ms": round(st["total"] / 1e6 / done * per_req, 3),
              "mean_wait_ms": round(st["average"] / 1e6, 3), "exchanges": st["count"]} for o, st in waits.items()}
    p50, p99 = hist_quantiles(b.get("@ow_us"), (0.5, 0.99))
    total_ns = sum(st["total"] for st in waits.values())
    return _part(total_ns / 1e6 / done * per_req,
                 "every exchange traced (sock:sock_send_length stamps the proxy's first send on an upstream "
                 "socket since its last data in, tcp:tcp_probe takes the first data segment back): the mean "
                 f"wait x the exchanges per request ({how}); from the first send, a request body the client "
                 "still uploads counts as the origin's",
                 "exact per exchange (kernel clock); p50/p99 are per exchange, the upper edges of log2 buckets; "
                 "per request as exact as the exchanges per request; an exchange still open at the window's end "
                 "is not in the mean", done, population="every request (the waits: every upstream exchange)",
                 p50_ms=p50, p99_ms=p99, by_origin=by, exchanges_per_request=round(per_req, 3),
                 source="kernel: every upstream exchange traced")


def _exchanges_per_request(ev: dict, req: dict, begun: int) -> tuple[float, str]:
    """Upstream exchanges per request: from the window's ticks, data segments out on the upstream sockets
    (and one per upstream connection opened and closed between two ticks: budget.bt's connects less the
    sockets born in the window) over the requests in from the clients; else the traced starts, over the
    requests, scaled from bpftrace's span to the window's."""
    flight = (ev.get("conns") or {}).get("flight") or {}
    up = flight.get("upstream") or {}
    unseen = max(0, ((ev.get("bpf") or {}).get("@conn_tries") or 0) - up.get("sockets_born_in_window", 0))
    sent = (up.get("data_segments_out") or 0) + (unseen if up else 0)
    arrived = kernel_requests(ev) if sent else None
    if sent and arrived:                # one window, one mechanism: the ticks' segments out over those in
        return sent / arrived, f"{sent} data segments sent upstream for {arrived} in from clients"
    span = (ev.get("window_s") or 0) / (ev.get("bpf_window_s") or ev.get("window_s") or 1)
    return begun * span / req["n"], f"{begun} exchanges traced in bpftrace's span, x{span:.2f} to the window's, " \
                                    f"for {req['n']} requests"


def _within_bounds(kernel: dict, total: dict, others: float, req: dict) -> dict:
    """The kernel's bounds narrowed by the proxy's own total: its total less the other parts it holds,
    kept within [lower, upper] (the kernel's bounds are measurements; the difference is an inference)."""
    low, high = kernel["ms"], kernel["ms_upper"]
    est = min(high, max(low, _scaled(total, req)[0] - others))
    share = (est - low) / (high - low) if high > low else 0.0
    by = {o: {**v, "ms": round(v["ms"] + share * (v["ms_upper"] - v["ms"]), 3)}
          for o, v in (kernel.get("by_origin") or {}).items()}
    return {**kernel, "ms": round(est, 3), "by_origin": by, "kernel_lower_ms": low,
            "mechanism": kernel["mechanism"] + "; where sockets were ambiguous, the proxy's own total less its other "
                         f"parts ({total.get('mechanism')}), kept within the kernel's bounds",
            "source": "kernel: upstream sockets sampled, bounded; the proxy's total"}


def origin_first_byte(ev: dict, req: dict, own: dict, names: dict, others: float) -> dict:
    """The proxy's own figure less its loop delay; else the kernel's, narrowed by the proxy's total
    (less `others`, the other parts it holds) where some sockets were ambiguous."""
    kernel = _kernel_first_byte(ev, req, names)
    theirs = (own.get("parts") or {}).get("origin_first_byte")
    if theirs and theirs.get("measurable") and theirs.get("ms") is not None:
        return _corrected(theirs, kernel, origin_unread_ms(ev, req), req, names)
    traced = _traced_first_byte(ev, req, names)
    if traced is not None:
        if kernel is not None:
            slack = kernel.get("resolution_ms") or 0.0
            traced["kernel_sampled"] = {**{k: kernel.get(k) for k in ("ms", "ms_upper", "mechanism")},
                                        "traced_within_bounds": kernel["ms"] - slack <= traced["ms"]
                                        <= kernel["ms_upper"] + slack}
        return traced
    if kernel is None:
        return unmeasurable("no upstream socket sampled and no figure from the proxy itself")
    total = own.get("proxy_total")
    if kernel["ms_upper"] > kernel["ms"] and total and total.get("measurable") and total.get("ms") is not None:
        return _within_bounds(kernel, total, others, req)
    return {**kernel, "at_least": kernel["ms_upper"] > kernel["ms"]}


def _scaled(part: dict, req: dict) -> tuple[float, str]:
    """A proxy's mean over its own population as ms per average request of the window."""
    n, covers = req["n"], part.get("requests")
    if isinstance(covers, int) and n:
        return part["ms"] * min(covers, n) / n, f"its mean over {covers} of {n} requests, spread over all"
    return part["ms"], "taken as covering every request (the proxy does not say how many it covers)"


def _corrected(theirs: dict, kernel: dict | None, unread: float | None, req: dict, names: dict) -> dict:
    """The proxy's own upstream time less what its loop added (origin data it had not read yet)."""
    ms, scaling = _scaled(theirs, req)
    taken = min(ms, unread or 0.0)
    part = {**theirs, "ms": round(ms - taken, 3), "population": "every request", "scaling": scaling,
            "source": ((theirs.get("mechanism") or "the proxy's own clock").split(":")[0]
                       + (", less its loop's delay (kernel)" if taken else "")),
            "proxy_figure_ms": round(ms, 3), "loop_delay_taken_out_ms": round(taken, 3),
            "mechanism": f"{theirs.get('mechanism')}; less the time the origin's data sat unread in the proxy's "
                         "sockets (kernel, Little's law on Recv-Q), which its own clock counts as the origin's"}
    by = dict(theirs.get("by_origin") or {})
    for o, v in by.items():
        by[o] = {**names.get(o, {}), **v}
    part["by_origin"] = by or _shared_out(kernel, part["ms"])
    if kernel and kernel.get("ms") is not None:
        part["kernel_cross_check"] = {"ms": kernel["ms"], "by_origin": kernel.get("by_origin"),
                                      "mechanism": kernel["mechanism"], "resolution_ms": kernel.get("resolution_ms")}
    return part


def _traced_reads(ev: dict, req: dict) -> dict | None:
    """budget_reads.bt's per-read waits (--deep): {side: (ms per request, p50, p99, reads)}; None without it."""
    b = ev.get("bpf") or {}
    if "budget_reads" not in (ev.get("scripts") or []) or not req["n"]:
        return None
    out = {}
    for side in ("cli", "up", "new"):
        st = b.get(f"@br_{side}_ns") or {}
        p50, p99 = hist_quantiles(b.get(f"@br_{side}_us"), (0.5, 0.99))
        out[side] = (st.get("total", 0) / 1e6 / req["n"], p50, p99, st.get("count", 0))
    return out


def _shared_out(kernel: dict | None, ms: float) -> dict:
    """A proxy figure with no split by origin, split as the kernel saw the awaiting sockets (the origins
    are then named even when the proxy's clock does not say which origin it timed)."""
    seen = (kernel or {}).get("by_origin") or {}
    weight = {o: v.get("ms_upper") or v.get("ms") or 0 for o, v in seen.items()}
    total = sum(weight.values())
    return {o: {**{k: v for k, v in seen[o].items() if k in ("name", "where")},
                "ms": round(ms * w / total, 3), "split": "as the kernel saw its sockets await"}
            for o, w in weight.items() if total and w}


def proxy_self(ev: dict, req: dict) -> dict:
    n, rate = req["n"], req["per_s"]
    sched = ev.get("sched") or {}
    if not n:
        return unmeasurable("no request counted in the window")
    flight = (ev.get("conns") or {}).get("flight") or {}
    ticks = flight.get("ticks") or 0
    traced, spread = _traced_reads(ev, req), None
    if traced:
        client, origin = traced["cli"][0] + traced["new"][0], traced["up"][0]
        how = ("ready data not read yet, every read traced (tcp:tcp_probe stamps the first unread segment, "
               "tcp:tcp_rcv_space_adjust reads it: --deep)")
        precision = "exact per read (kernel clock); p50/p99 within a factor of 2 (log2 buckets)"
    else:
        client = _little(flight.get("client_unread_sum", 0), ticks, rate)
        origin = origin_unread_ms(ev, req)
        how = "ready data not read yet (Little's law on its client and upstream sockets' Recv-Q at every tick)"
        precision = _little_precision(ticks, rate)
        spread = _tick_uncertainty(flight.get("client_unread_per_tick"), rate)
        if spread:
            precision += f"; client data unread ± {spread} ms (twice the standard error over the ticks)"
    cpu = sched["run_ns"] / 1e6 / n if sched.get("available") else None
    if client is None and cpu is None:
        return unmeasurable("neither its sockets nor its threads' schedstat could be read")
    delay = sched["run_delay_ns"] / 1e6 / n if sched.get("available") else None
    parts = {"client_data_unread_ms": client, "origin_data_unread_ms": origin, "cpu_ms": cpu}
    ms = sum(v for v in parts.values() if v is not None)
    busiest = sched.get("busiest_thread") or {}
    extra = {"per_read": {side: {"p50_ms": t[1], "p99_ms": t[2], "reads": t[3]} for side, t in traced.items()}} \
        if traced else {}
    return _part(ms, how + " + its CPU per request (schedstat run time of every thread / the requests)",
                 precision + "; CPU exact (scheduler ns)", ticks,
                 split={k: (None if v is None else round(v, 3)) for k, v in parts.items()},
                 run_queue_ms=None if delay is None else round(delay, 3),
                 run_queue_note="time its threads waited for a CPU, per request; inside the unread time when the "
                                "loop waited with data ready, so shown and not added",
                 busiest_thread=busiest or None, resolution_ms=None if traced else _resolution(ticks, rate),
                 **({"uncertainty_ms": spread} if spread else {}),
                 source="kernel: every read traced + schedstat" if traced else "kernel: sockets sampled + schedstat",
                 **extra)


def _less_overlap(own_self: dict, queue: dict) -> dict:
    """proxy_self less the wait the proxy's queue also counts. A Varnish session waits in its pool's queue
    before a worker reads its request (cache_wrk.c Pool_Task), so the kernel sees that same wait as client
    data not yet read: the proxy's figure names it (`overlaps`), and it is added once, as the queue's."""
    split = own_self.get("split") or {}
    unread = split.get("client_data_unread_ms")
    if not (queue.get("measurable") and own_self.get("measurable") and unread
            and str(queue.get("overlaps") or "").startswith("proxy_self: client data")):
        return own_self
    same = min(unread, queue.get("overlap_ms", queue["ms"]) or 0.0)
    return {**own_self, "ms": round(own_self["ms"] - same, 3),
            "split": {**split, "client_data_unread_ms": round(unread - same, 3)},
            "overlap_taken_out_ms": round(same, 3),
            "overlap_note": "client data unread while the session waited in the proxy's queue: counted there"}


def compute(ev: dict) -> dict:
    """The budget of the window's average request (pure over the evidence)."""
    own, names = _own(ev)
    req = requests(ev, own)
    kind = (ev.get("proxy") or {}).get("kind")
    parts = {"accept_queue": accept_queue(ev, req), "proxy_queue": proxy_queue(own, kind),
             "origin_connect": origin_connect(ev, req, own, names), "proxy_self": proxy_self(ev, req)}
    parts["proxy_self"] = _less_overlap(parts["proxy_self"], parts["proxy_queue"])
    held = sum(parts[k]["ms"] for k in ("proxy_queue", "origin_connect", "proxy_self")
               if parts[k].get("measurable") and parts[k].get("ms") is not None)
    parts["origin_first_byte"] = origin_first_byte(ev, req, own, names, held)
    parts = {k: parts[k] for k in PARTS}
    known = {k: v["ms"] for k, v in parts.items() if v.get("measurable") and v.get("ms") is not None}
    total = sum(known.values())
    top = max(known, key=known.get, default=None)
    dominant = top if top and total > 0 and known[top] > DOMINANT_SHARE * total else None
    out = {"parts": parts, "total_ms": round(total, 3), "unmeasured": [k for k in PARTS if k not in known],
           "requests": req, "dominant": dominant, "dominant_share": DOMINANT_SHARE,
           "shares": {k: round(v / total, 3) for k, v in known.items()} if total > 0 else {}, "checks": []}
    theirs = own.get("proxy_total")
    if theirs and theirs.get("measurable") and theirs.get("ms"):
        check(out, "proxy_total", _scaled(theirs, req)[0], theirs.get("mechanism", "the proxy's own total"))
    return out


def check(b: dict, against: str, ms: float, what: str) -> dict:
    """Add a comparison of the budget's total with another clock of the same requests (the proxy's own
    total, the load generator's mean): agrees within AGREES_WITHIN."""
    ratio = b["total_ms"] / ms if ms else None
    row = {"against": against, "ms": round(ms, 3), "what": what, "ratio": None if ratio is None else round(ratio, 3),
           "agrees": ratio is not None and abs(ratio - 1) <= AGREES_WITHIN}
    b["checks"].append(row)
    return row


def hist_quantiles(hist, qs) -> tuple:
    """Quantiles (ms) of a bpftrace log2 histogram of microseconds: the upper edge of the bucket holding
    each quantile (within a factor of 2 by construction)."""
    if not isinstance(hist, list) or not hist:
        return tuple(None for _ in qs)
    total = sum(b.get("count", 0) for b in hist)
    out = []
    for q in qs:
        seen, val = 0, None
        for b in hist:
            seen += b.get("count", 0)
            if total and seen >= q * total:
                val = round(b.get("max", b.get("min", 0)) / 1000, 3)
                break
        out.append(val)
    return tuple(out)


LABELS = {"accept_queue": "accept queue (kernel)", "proxy_queue": "queue inside the proxy",
          "origin_connect": "connecting to the origin", "origin_first_byte": "origin's first byte",
          "proxy_self": "the proxy itself"}


def _detail(name: str, p: dict) -> str:
    """What stands behind one part's figure, in a few words (the full mechanism is in the JSON)."""
    if name == "proxy_self" and p.get("split"):
        s = p["split"]
        fmt = lambda v: "?" if v is None else f"{v:.2f}"
        out = (f"unread client data {fmt(s.get('client_data_unread_ms'))} + origin data "
               f"{fmt(s.get('origin_data_unread_ms'))} + CPU {fmt(s.get('cpu_ms'))} ms")
        return out + (f"; run-queue wait {p['run_queue_ms']:.2f} ms (inside, not added)"
                      if p.get("run_queue_ms") is not None else "")
    bits = []
    top = sorted((p.get("by_origin") or {}).items(), key=lambda kv: -(kv[1].get("ms") or 0))[:2]
    for o, v in top:
        bits.append(o + (f" {v['name']}" if v.get("name") else "") + (f" ({v['where']})" if v.get("where") else "")
                    + (f" {v['ms']:.1f} ms" if v.get("ms") is not None else ""))
    if p.get("p50_ms") is not None:
        bits.append(f"p50 {p['p50_ms']:g} / p99 {p['p99_ms']:g} ms" + (" per connect" if p.get("per_connect") else ""))
    if p.get("loop_delay_taken_out_ms"):
        bits.append(f"the proxy said {p['proxy_figure_ms']:.1f} ms, less {p['loop_delay_taken_out_ms']:.1f} ms "
                    "its loop took to read the answer")
    if p.get("cause", {}).get("directive"):
        c = p["cause"]
        bits.append(f"`{c['directive']}` ({c.get('where')}), queue now {c.get('queue_now')}, max {c.get('queue_max')}")
    source = p.get("source") or (p.get("mechanism") or "").split(":")[0]
    return "; ".join([source] + bits)


def rows(b: dict) -> list[list[str]]:
    """[part, ms per request, share, how] per part, for the terminal, Markdown and HTML alike."""
    out = []
    for name in PARTS:
        p = b["parts"][name]
        if p.get("measurable") and p.get("ms") is not None:
            share = (b.get("shares") or {}).get(name)
            out.append([LABELS[name], f"{p['ms']:,.2f}", "-" if share is None else f"{share:.0%}", _detail(name, p)])
        else:
            out.append([LABELS[name], "not measurable here", "", p.get("why") or ""])
    return out


def headline(b: dict) -> str:
    """One line: the total, the request count it is over, the dominant part and the checks."""
    r = b.get("requests") or {}
    n = f"{r['n']:,} requests" if isinstance(r.get("n"), int) else "requests not counted"
    dom = (f"; dominant: {LABELS[b['dominant']]} ({b['shares'][b['dominant']]:.0%})" if b.get("dominant") else
           "; no part holds more than half")
    checks = "".join(f"; against {c['against']} {c['ms']:,.1f} ms: x{c['ratio']:.2f} "
                     f"({'agrees' if c['agrees'] else 'does not agree'})" for c in b.get("checks") or []
                     if c.get("ratio") is not None)
    stuck = (((b.get("parts") or {}).get("accept_queue") or {}).get("starved") or {}).get("whole_window")
    starved_text = (f"; {stuck} connection(s) waited in the accept queue the whole window, never accepted "
                    "(not in the mean)" if stuck else "")
    return f"{b['total_ms']:,.2f} ms per request ({n}, counted by {r.get('source', '?')}){dom}{checks}{starved_text}"

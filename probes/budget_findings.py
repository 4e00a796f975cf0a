"""Findings from the time budget (budget.py): when no cap holds the proxy
back, where its requests' time goes is the answer. Pure over the evidence,
the budget and the other rules' findings, so a recorded window replays.

Each rule needs its part to be the budget's dominant one (more than half
of the total: budget.DOMINANT_SHARE) and measurably non-zero (at least its
own resolution), and a mechanism that says the wait is a limit, not the
normal course of a request:
- proxy-queue: a queue formed inside the proxy (its own counters), behind
  the directive that makes requests wait;
- accept-wait: connections waited in a listener's accept queue (seen at a
  tick) while the proxy is at none of its caps (an own cap that stopped
  accepting is its own finding, with this wait as evidence), or sat there
  the whole window, never accepted (budget.starved: no mean shows them);
- proxy-cpu: the proxy holds ready data while a loop thread is near a full
  core, or all its threads together near all the host's CPUs (a thread
  pool) (CPU_SATURATED: queueing delay grows as ρ/(1-ρ) service times, 9 at
  0.9), or its threads wait for a CPU as long as they run (the host's CPUs
  are short); loop-lag: it holds ready data while its loop blocks on the
  disk or scans (the blocking-disk-io and poll-scan findings);
- slow-origin: the origin's first byte dominates and is at least
  SIGNIFICANT_MS. An origin answering is the normal course of a request, so
  here a floor is needed: 40 ms is TCP_DELACK_MIN (include/net/tcp.h,
  HZ/25), the longest Linux itself delays an ACK on purpose. A wait below
  it is within what TCP alone adds to an exchange; the budget still shows
  it, as information.
Severity medium (time lost, nobody refused); impact is the ms lost per
request, so among medium findings the one costing most time ranks first and
a proxy's own cap (impact 1e6 and up) stays ahead.
"""

from proxytune import proxies as kinds
from .findings import SEVERITY_RANK, Finding

SIGNIFICANT_MS = 40.0
CPU_SATURATED = 0.9
OWN_CAP_IDS = ("haproxy-maxconn", "nginx-worker-connections", "varnish-thread-pool", "squid-fd-limit",
               "trafficserver-connections-throttle")
LOOP_CAUSES = ("blocking-disk-io", "poll-scan")
CPU_CAUSES = ("cpu-bound", "cpu-hotspot")


def _ms(v) -> str:
    return "?" if v is None else f"{v:.1f} ms" if v < 100 else f"{v:.0f} ms"


def _significant(part: dict) -> bool:
    res = part.get("resolution_ms") or 0.0
    return bool(part.get("measurable")) and (part.get("ms") or 0) > 0 and part["ms"] >= res


def _share(b: dict, name: str) -> float:
    return (b.get("shares") or {}).get(name, 0.0)


def _budget_evidence(b: dict, name: str) -> dict:
    part = b["parts"][name]
    return {"wait_ms_per_request": part["ms"], "share_of_budget": _share(b, name), "budget_total_ms": b["total_ms"],
            "mechanism": part.get("mechanism"), "precision": part.get("precision"),
            "requests": (b.get("requests") or {}).get("n"), "requests_counted_by": (b.get("requests") or {}).get("source")}


def _kind_text(ev: dict, hook: str, *args) -> str | None:
    """A proxy module's own words for a fix (optional hooks: slow_origin_fix, queue_fix)."""
    p = ev.get("proxy") or {}
    kind = kinds.by_kind(p.get("kind")) if p.get("kind") else None
    fn = getattr(kind, hook, None)
    return fn(p, *args) if fn else None


def slow_origin(ev: dict, b: dict, found: list) -> Finding | None:
    part = b["parts"]["origin_first_byte"]
    if b.get("dominant") != "origin_first_byte" or not _significant(part) or part["ms"] < SIGNIFICANT_MS:
        return None
    origins = sorted((part.get("by_origin") or {}).items(), key=lambda kv: -(kv[1].get("ms") or 0))
    named = [{"origin": o, "name": v.get("name"), "where": v.get("where"), "wait_ms": v.get("ms")} for o, v in origins]
    who = ", ".join(o + (f" ({v.get('name')}, {v.get('where')})" if v.get("name") else "") for o, v in origins[:3]) \
        or "its origin"
    connect = b["parts"]["origin_connect"]
    evidence = {**_budget_evidence(b, "origin_first_byte"), "origins": named,
                "connect_ms_per_request": connect.get("ms"),
                "loop_delay_taken_out_ms": part.get("loop_delay_taken_out_ms"),
                "kernel_cross_check": part.get("kernel_cross_check"),
                "wait_at_most_ms": part.get("ms_upper") if part.get("at_least") else None,
                "note": "the wait is the origin's: from the request sent to its first byte, less the time its "
                        "answer sat unread in the proxy (that is the proxy's own, counted in proxy_self)"}
    fix = (f"tuning this host or the proxy's limits will not help: requests spend {part['ms']:.0f} ms "
           f"({_share(b, 'origin_first_byte'):.0%} of their time) waiting for {who} to answer. Look at the origin "
           "(its own latency, its capacity, what it waits on); in the proxy, its origin timeouts bound how long a "
           "client waits, and connection reuse to the origin saves a connect per request. "
           + (_kind_text(ev, "slow_origin_fix") or ""))
    wait = (f"at least {_ms(part['ms'])} (at most {_ms(part.get('ms_upper'))})" if part.get("at_least")
            else _ms(part["ms"]))
    return Finding("slow-origin", "medium", f"requests wait {wait} for the origin's first byte ({who})",
                   evidence, fix.strip(), impact=part["ms"])


def proxy_queue(ev: dict, b: dict, found: list) -> Finding | None:
    part = b["parts"]["proxy_queue"]
    cause = part.get("cause") or {}
    # a queue formed in the window: its length seen above 0 (haproxy, varnish), or requests counted as having
    # waited in it (Traffic Server shows no queue length: its log's SERVER_CONNECT - SERVER_FIRST_CONNECT)
    formed = any(isinstance(cause.get(k), (int, float)) and cause[k] > 0
                 for k in ("queue_now", "queue_max", "waited", "queue_mean"))
    if not _significant(part) or not formed:
        return None
    cap = _own_cap_queueing(found, cause)
    if cap:                   # the proxy's own cap makes them wait (Varnish's pool at thread_pool_max queues
        cap.evidence.update({"queue_wait_ms_per_request": part["ms"],      # its sessions): one finding, the cap's,
                             "queue": {k: cause.get(k) for k in ("what", "directive", "queue_now", "queue_max")}})
        return None           # which ranks first and carries the wait whichever part of the budget dominates
    if b.get("dominant") != "proxy_queue":
        return None
    where = f"`{cause.get('directive')}` ({cause.get('where')})" if cause.get("directive") else "its queue"
    evidence = {**_budget_evidence(b, "proxy_queue"), "directive": cause.get("directive"), "where": cause.get("where"),
                "limit": cause.get("limit"), "queue_now": cause.get("queue_now"), "queue_max": cause.get("queue_max"),
                "what": cause.get("what")}
    fix = _kind_text(ev, "queue_fix", cause) or (
        f"requests wait inside the proxy behind {where}: raise the limit if the origin can take more requests at "
        "once (measure it), or keep it and accept the wait: the queue protects the origin; more clients or a "
        "longer backlog only lengthen it")
    return Finding("proxy-queue", "medium", f"requests wait {_ms(part['ms'])} in the proxy's queue behind {where}",
                   evidence, fix, impact=part["ms"])


def _own_cap_queueing(found: list, cause: dict) -> Finding | None:
    """An own cap's finding for the directive that makes requests wait (its first word: thread_pool_max), when
    the cap's action is to queue: that finding already names the limit, ranks first and gets the wait."""
    word = (str(cause.get("directive") or "").split() or [""])[0]
    return next((f for f in found if f.id in OWN_CAP_IDS and word
                 and str(f.evidence.get("cap") or "").split()[:1] == [word]), None)


def _cause(found: list, ids) -> Finding | None:
    return next((f for f in found if f.id in ids and f.severity in ("high", "medium")), None)


def accept_wait(ev: dict, b: dict, found: list) -> Finding | None:
    part = b["parts"]["accept_queue"]
    if any(f.id in OWN_CAP_IDS for f in found):
        return None                    # the cap stopped accepting: its finding carries this wait
    if (part.get("starved") or {}).get("connections"):
        return _never_accepted(ev, b, found)
    if b.get("dominant") != "accept_queue" or not _significant(part):
        return None
    busiest = b["parts"]["proxy_self"].get("busiest_thread") or {}
    cause = _cause(found, LOOP_CAUSES + CPU_CAUSES)
    if cause:
        why = f"its loop is held up: see {cause.id} ({cause.title})"
    elif (busiest.get("cpu_share") or 0) >= CPU_SATURATED:
        why = (f"its busiest thread ({busiest.get('comm')}, tid {busiest.get('tid')}) runs {busiest['cpu_share']:.0%} "
               "of a CPU: the loop is too busy to accept sooner")
    else:
        why = "no cap is reached and its loop is not saturated: it accepts in batches too small or too rarely"
    evidence = {**_budget_evidence(b, "accept_queue"), "listeners": part.get("by_port"), "why": why,
                "busiest_thread": busiest or None}
    fix = (cause.fix if cause else
           "let the proxy accept more per loop turn or run more accepting workers (nginx `multi_accept on` and "
           "worker_processes, haproxy `tune.maxaccept` and nbthread, squid workers), then look at what keeps its "
           "loop from returning to the listener")
    return Finding("accept-wait", "medium",
                   f"new connections wait {_ms(part['ms'])} per request in the accept queue, with no cap reached",
                   evidence, fix, impact=part["ms"])


def _never_accepted(ev: dict, b: dict, found: list) -> Finding:
    """Clients left in the accept queue through the whole window while no cap of the proxy's is reached: its
    loop does not come back to the listener at all (blocked, or not accepting), a stall no mean shows."""
    part = b["parts"]["accept_queue"]
    stuck = part["starved"]
    cause = _cause(found, LOOP_CAUSES + CPU_CAUSES)
    evidence = {"never_accepted": stuck["by_port"], "there_the_whole_window": stuck.get("whole_window"),
                "window_s": stuck.get("window_s"),
                "listeners": part.get("by_port"), "mechanism": part.get("mechanism"),
                "why": f"see {cause.id} ({cause.title})" if cause else "no cap is reached: the proxy did not accept"}
    fix = (cause.fix if cause else
           "find what keeps the proxy from accepting (a loop blocked, a listener paused, a worker that does not "
           "accept): these clients get no answer at all while the listener's queue holds them")
    return Finding("accept-wait", "medium",
                   f"{stuck['whole_window']} connection(s) waited in the accept queue the whole window "
                   f"({stuck.get('window_s')} s), never accepted, with no cap reached",
                   evidence, fix, impact=stuck.get("little_ms") or 0.0)


def proxy_cpu(ev: dict, b: dict, found: list) -> Finding | None:
    part = b["parts"]["proxy_self"]
    split = part.get("split") or {}
    unread = (split.get("client_data_unread_ms") or 0) + (split.get("origin_data_unread_ms") or 0)
    if b.get("dominant") != "proxy_self" or not _significant(part) or unread <= 0:
        return None
    busiest = part.get("busiest_thread") or {}
    sched = ev.get("sched") or {}
    starved = sched.get("run_ns") and sched.get("run_delay_ns", 0) >= sched["run_ns"] and part["ms"] >= SIGNIFICANT_MS
    blocked, cpu = _cause(found, LOOP_CAUSES), _cause(found, CPU_CAUSES)
    evidence = {**_budget_evidence(b, "proxy_self"), "ready_data_unread_ms": round(unread, 3), "split": split,
                "run_queue_ms": part.get("run_queue_ms"), "busiest_thread": busiest or None}
    if blocked:
        evidence["cause"] = {"finding": blocked.id, "title": blocked.title}
        return Finding("loop-lag", "medium", f"the proxy holds ready data {_ms(unread)} per request: {blocked.title}",
                       evidence, blocked.fix, impact=part["ms"])
    host = sched.get("cpu_share_of_host") or 0
    if (busiest.get("cpu_share") or 0) >= CPU_SATURATED or host >= CPU_SATURATED or starved:
        what = ("its threads wait for a CPU as long as they run: the host's CPUs are busy with other work" if starved
                else f"its threads use {host:.0%} of the host's {sched.get('cpus')} CPUs" if host >= CPU_SATURATED
                else f"its busiest thread ({busiest.get('comm')}, tid {busiest.get('tid')}) runs "
                     f"{busiest.get('cpu_share', 0):.0%} of a CPU")
        if cpu:
            evidence["cause"] = {"finding": cpu.id, "title": cpu.title}
        evidence["why"] = what
        fix = (cpu.fix if cpu else
               "give the proxy more CPU: more workers or threads (nginx worker_processes auto, haproxy nbthread, "
               "squid workers), fewer other tasks on its cores, or less work per request")
        return Finding("proxy-cpu", "medium", f"the proxy holds ready data {_ms(unread)} per request: {what}",
                       evidence, fix, impact=part["ms"])
    return None


RULES = [slow_origin, proxy_queue, accept_wait, proxy_cpu]


def evaluate(ev: dict, b: dict, found: list) -> list[Finding]:
    """The budget's findings (at most one per part: only the dominant part can give one). An own cap's
    finding gets the accept-queue wait it causes as evidence."""
    acc = b["parts"]["accept_queue"]
    for f in found:
        if f.id in OWN_CAP_IDS and acc.get("measurable"):
            f.evidence["accept_wait_ms_per_request"] = acc["ms"]
        if f.id in OWN_CAP_IDS and acc.get("starved"):   # clients the cap left unaccepted the whole window
            f.evidence["never_accepted"] = acc["starved"]["by_port"]
    return [f for f in (rule(ev, b, found) for rule in RULES) if f]


def rank(found: list[Finding], new: list[Finding]) -> list[Finding]:
    """The budget's findings among the others: each before the first one of lower severity or of the same
    severity and less impact; the others keep their order."""
    out = list(found)
    for f in new:
        key = (SEVERITY_RANK[f.severity], -f.impact)
        at = next((i for i, g in enumerate(out) if (SEVERITY_RANK[g.severity], -g.impact) > key), len(out))
        out.insert(at, f)
    return out

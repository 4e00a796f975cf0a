"""The one rule for a proxy's own cap, stated once for every proxy.

A cap is data a proxy module gives (proxies/*.py `caps(ev)`, proxies/cap.py): the directive,
its value and `file:line`, how the proxy counts usage against it, the usage
at which the proxy stops accepting, queues or refuses, what it does there,
and the source that says so. The signature is the same for all: the proxy
holds its own cap (usage by its own counting at the point where its source
says it stops) or counts refusals of its own, and its listener's accept
queue is non-empty (or overflowed) in the window. The cap, not the kernel's
queue, is then the finding; the queue is its evidence. A cap reached with
no one waiting is medium (the next burst waits); with clients waiting or
refused it is high.

When nothing limits the proxy, `headroom` says how far each cap and kernel
resource is from its limit: silence is not an answer.
"""

from dataclasses import asdict

from proxytune.proxies.cap import Cap

from .findings import Finding, cpu_headroom


def accept_queue(ev: dict, ports: tuple = ()) -> dict:
    """The proxy's listeners in the window: the accept queue's peak over the samples (and at the end),
    the backlog, the drops the kernel counted on them (None when not read), and the namespace's
    ListenOverflows (every listener's, not only these: see findings.overflowed_here)."""
    conns = ev.get("conns") or {}
    sampled = conns.get("ports") or {}
    rows = {}
    for port, s in sampled.items():
        if not ports or port in ports:
            rows[port] = {"queued_peak": s.get("queued_peak", 0), "backlog": s.get("backlog"),
                          "samples_with_queue": s.get("queued_samples", 0), "drops": s.get("drops")}
    for l in ev.get("listeners") or []:
        port = l["local"].rsplit(":", 1)[-1]
        if not ports or port in ports:
            r = rows.setdefault(port, {"queued_peak": 0, "backlog": l["backlog"], "samples_with_queue": 0})
            r["queued_peak"] = max(r["queued_peak"], l["queued"])
    read = (conns.get("listen_drops") or {}).get("available")
    return {"listeners": rows, "queued_peak": max((r["queued_peak"] for r in rows.values()), default=0),
            "own_drops": sum(r.get("drops") or 0 for r in rows.values()) if read else None,
            "ListenOverflows": (ev.get("netstat") or {}).get("ListenOverflows", 0)}


def overflows_here(q: dict) -> int:
    """The overflows that were this cap's listeners': their own drops when read, else the namespace's count."""
    return q["own_drops"] if q.get("own_drops") is not None else q["ListenOverflows"]


# the kernel's symptoms of a proxy that stopped accepting: its accept queue fills, then the SYN queue
# (judged against the same listen backlog: inet_csk_reqsk_queue_is_full) overflows behind it
KERNEL_SYMPTOMS = ("accept-queue-overflow", "syn-backlog-overflow")


def kernel_symptom(generic: dict) -> dict | None:
    found = [(fid, generic[fid]) for fid in KERNEL_SYMPTOMS if fid in generic]
    if not found:
        return None
    out = {"finding": found[0][0], **found[0][1].evidence}
    if len(found) > 1:
        out["also"] = {fid: f.evidence for fid, f in found[1:]}
    return out


def finding(cap: Cap, ev: dict, generic: dict) -> Finding | None:
    """The cap as a finding when the proxy holds it or refuses by its own count; else None."""
    refused = cap.refusals()
    if not (cap.reached() or refused):
        return None
    q = accept_queue(ev, cap.ports)
    waiting = q["queued_peak"] > 0 or overflows_here(q) > 0
    limit = f"{cap.limit}{' (estimated)' if cap.estimate else ''}"
    return Finding(cap.id, "high" if refused or waiting else "medium",
                   f"{cap.proxy} is at its {cap.what} {limit}: {cap.at_cap}",
                   {"cap": cap.directive, "limit": cap.limit, "where": cap.where, "used_peak": cap.used,
                    "counted": cap.counted, "refuses_at": cap.refuses_at, "at_cap": cap.at_cap,
                    "source": cap.source, "refused_in_window": cap.refused, "accept_queue": q,
                    "limit_estimated": cap.estimate, **cap.extra, "kernel_symptom": kernel_symptom(generic)},
                   cap.fix, impact=1e6 + refused + overflows_here(q))


def headroom(caps: list[Cap], ev: dict) -> list[dict]:
    """How far the proxy is from each of its caps and the kernel's limits, for the answer
    'no limit found'."""
    # "key": the row's name without what changes from window to window (a pid, a destination), for
    # a metric's label: a label that changes is a new series each time
    rows = [{"what": f"{c.proxy} {c.what}", "key": f"{c.proxy} {c.what}", "used": c.used, "limit": c.limit,
             "stops_at": c.refuses_at, "where": c.where} for c in caps]
    for p in (ev.get("procs") or {}).values():
        if isinstance(p.get("nofile_soft"), int):
            rows.append({"what": f"fds of pid {p['pid']} ({p.get('comm')})", "key": "fds of a process",
                         "used": p.get("fds_open"),
                         "limit": p["nofile_soft"], "where": "its soft RLIMIT_NOFILE"})
    q = accept_queue(ev)
    for port, l in q["listeners"].items():
        rows.append({"what": f"accept queue of port {port}", "key": f"accept queue of port {port}",
                     "used": l["queued_peak"], "limit": l["backlog"],
                     "where": "listen backlog (capped by net.core.somaxconn)"})
    eph = (ev.get("conns") or {}).get("ephemeral")
    if eph and eph.get("range_size"):
        used = max(v for v in (eph.get("peak_connected"), eph.get("at_end_with_time_wait"), 0) if v is not None)
        toward = eph.get("at_end_toward") if used == eph.get("at_end_with_time_wait") else eph.get("peak_toward")
        rows.append({"what": "ephemeral ports toward its namespace's busiest destination"
                             + (f" ({toward})" if toward else "") + " (TIME-WAIT counted at the end)",
                     "key": "ephemeral ports", "used": used, "limit": eph["range_size"],
                     "where": f"net.ipv4.ip_local_port_range {ev.get('port_range')}"})
    if cpu := cpu_headroom(ev):
        rows.append(cpu)
    for r in rows:
        r["share"] = (round(r["used"] / r["limit"], 3) if isinstance(r["used"], (int, float)) and r["limit"]
                      else None)
    return rows


def as_json(caps: list[Cap]) -> list[dict]:
    return [asdict(c) for c in caps]

"""Findings in the watched proxy's own terms. The generic rules
(findings.py) see the kernel's symptoms; when the proxy's own cap is the
cause (HAProxy at maxconn stops accepting, Varnish out of worker threads,
nginx out of worker_connections, Traffic Server at connections_throttle),
that cap is the finding and the kernel's symptom becomes its evidence.
Fixes name the directive of that proxy, where it is set and its current
value. Reads only ev["proxy"] (doctor.gather) and the generic findings,
so it is testable on recorded evidence. An unknown proxy keeps the
generic advice unchanged.
"""

from proxytune.core.numbers import uint as as_number     # a directive's whole value, ASCII digits only

from .findings import Finding

# the proxy's connection count within this share of its cap counts as "at the cap"
AT_CAP = 0.95


def _where(d: dict, name: str, conf: str | None) -> str:
    item = d.get(name) or {}
    if item.get("line"):
        return f"{conf}:{item['line']}"
    return item.get("where") or (f"{conf} (not set)" if conf else "not set")


def _peak(p: dict, key: str) -> int | None:
    vals = [s.get(key) for s in (p.get("stats_before") or {}, p.get("stats_after") or {}) if s.get("available")]
    vals = [v for v in vals if isinstance(v, int)]
    return max(vals) if vals else None


def _delta(p: dict, key: str) -> int | None:
    a, b = p.get("stats_before") or {}, p.get("stats_after") or {}
    if not isinstance(a.get(key), int) or not isinstance(b.get(key), int):
        return None
    return b[key] - a[key]


def _kernel_symptom(generic: dict) -> dict | None:
    f = generic.get("accept-queue-overflow")
    return {"finding": "accept-queue-overflow", **f.evidence} if f else None


def haproxy_maxconn(ev: dict, generic: dict) -> Finding | None:
    p = ev["proxy"]
    d, conf = p["directives"], p.get("config")
    cur, cap = _peak(p, "CurrConns"), _peak(p, "Maxconn")
    if cap is None:                       # no stats socket: the configured maxconn against the fds it holds
        cap = as_number(d.get("maxconn", {}).get("value"))
        cur = max((pr.get("fds_open") or 0 for pr in ev["procs"].values()), default=0) // 2 if cap else None
    if not cap or cur is None or cur < AT_CAP * cap:
        return None
    symptom = _kernel_symptom(generic)
    value = d.get("maxconn", {}).get("value")
    named = f"`maxconn {value}`" if value else f"maxconn (not set: haproxy derived {cap} from its fd limit)"
    return Finding("haproxy-maxconn", "high" if symptom else "medium",
                   f"haproxy is at its maxconn {cap} and stops accepting: new clients wait in the kernel's queue",
                   {"CurrConns": cur, "Maxconn": cap, "directive": named, "where": _where(d, "maxconn", conf),
                    "stats": (p.get("stats_after") or {}).get("source") or "stats socket not available: fds / 2",
                    "kernel_symptom": symptom},
                   f"raise {named} in the global section of {_where(d, 'maxconn', conf)} (e.g. maxconn 60000) and "
                   "keep the fd limit at 2 x maxconn + reserve (profile linux/haproxy: LimitNOFILE 131072); "
                   "net.core.somaxconn or a longer backlog only lengthens the queue in front of a proxy that has "
                   "stopped accepting", impact=1e6 + ((symptom or {}).get("per_s") or 0))


def varnish_threads(ev: dict, generic: dict) -> Finding | None:
    p = ev["proxy"]
    d = p["directives"]
    limited, queued, dropped = (_delta(p, k) for k in ("MAIN.threads_limited", "MAIN.sess_queued",
                                                       "MAIN.sess_dropped"))
    qlen = _peak(p, "MAIN.thread_queue_len") or 0
    if not (limited or dropped or qlen) and not (queued and queued > 0):
        return None
    pools, tmax = int(d["thread_pools"]["value"]), int(d["thread_pool_max"]["value"])
    return Finding("varnish-thread-pool", "high" if dropped else "medium",
                   f"varnish's worker threads are exhausted ({pools} pools x thread_pool_max {tmax})",
                   {"threads": _peak(p, "MAIN.threads"), "thread_limit": pools * tmax,
                    "threads_limited": limited, "sess_queued": queued, "sess_dropped": dropped,
                    "thread_queue_len": qlen, "thread_pool_max": f"{tmax} ({d['thread_pool_max'].get('where')})",
                    "kernel_symptom": _kernel_symptom(generic)},
                   f"raise thread_pool_max (now {tmax}, {d['thread_pool_max'].get('where')}): `varnishd -p "
                   f"thread_pool_max=N` or `varnishadm param.set thread_pool_max N` (default 5000); sessions beyond "
                   f"the pool wait in its queue (thread_queue_limit {d['thread_queue_limit']['value']}) and are "
                   "then dropped (sess_dropped). Slow backends hold workers: check them too",
                   impact=1e6 + (dropped or 0))


def nginx_worker_connections(ev: dict, generic: dict) -> Finding | None:
    p = ev["proxy"]
    d, conf = p["directives"], p.get("config")
    wc = as_number(d.get("worker_connections", {}).get("value")) or 512
    said = _delta(p, "not_enough_messages") or 0
    workers = [pr for pr in ev["procs"].values() if pr.get("fds_open")]
    peak = max((pr["fds_open"] for pr in workers), default=0)
    if not said and peak < AT_CAP * wc:
        return None
    return Finding("nginx-worker-connections", "high" if said or generic.get("accept-queue-overflow") else "medium",
                   f"nginx's workers are out of worker_connections ({wc})",
                   {"worker_connections": wc, "where": _where(d, "worker_connections", conf),
                    "not_enough_messages_in_window": said, "busiest_worker_fds": peak,
                    "waiting_in_accept_queue": sum(l["queued"] for l in ev.get("listeners", [])),
                    "kernel_symptom": _kernel_symptom(generic)},
                   f"raise `worker_connections {wc}` in the events block of {_where(d, 'worker_connections', conf)} "
                   "(e.g. 16384; a proxied request holds two) and worker_rlimit_nofile to at least twice it "
                   "(profile linux/nginx for the service's LimitNOFILE)", impact=1e6 + said)


def ats_throttle(ev: dict, generic: dict) -> Finding | None:
    p = ev["proxy"]
    d, conf = p["directives"], p.get("config")
    name = "proxy.config.net.connections_throttle"
    cap = as_number(d.get(name, {}).get("value"))
    # the throttle counts client and origin connections; ATS's own gauge can read 0 under load
    counted = [v for v in (_peak(p, "connections_currently_open"), (ev.get("connections") or {}).get("total"))
               if v is not None]
    cur = max(counted) if counted else None
    after = p.get("stats_after") or {}
    throttled = _delta(p, "connections_throttled_in")
    if throttled is None:                 # at the cap it reset our first /_stats: the count since its start
        throttled = after.get("connections_throttled_in")
    warned = _delta(p, "throttle_warnings") or 0
    reset = not after.get("available") and after.get("throttle_warnings", 0) > 0    # it refused our /_stats too
    since_start = after.get("throttle_warnings") or 0       # logged at most every few minutes
    if not cap or not (throttled or warned or reset or since_start or (cur is not None and cur >= AT_CAP * cap)):
        return None
    return Finding("trafficserver-connections-throttle", "high" if throttled or warned or reset else "medium",
                   f"traffic_server reached its connections_throttle {cap} and resets new connections",
                   {"connections_throttle": cap, "where": _where(d, name, conf), "connections_currently_open": cur,
                    "connections_throttled_in": throttled, "throttle_warnings_in_window": warned,
                    "throttle_warnings_since_start": since_start,
                    "throttled_at_connections": after.get("throttled_at_connections"),
                    "stats": after.get("source") or after.get("reason"), "kernel_symptom": _kernel_symptom(generic)},
                   f"raise `CONFIG {name} INT {cap}` in {_where(d, name, conf)} (default 30000) and the fd limit "
                   "above 2 x it (profile linux/trafficserver: LimitNOFILE 65536); then traffic_ctl config reload "
                   "or restart", impact=1e6 + (throttled or 0))


def squid_fd_limit(ev: dict, generic: dict) -> Finding | None:
    """Squid stops accepting well before its fd limit: with fewer than twice its reserve free
    (RESERVED_FD = min(100, max/4)) it counts fd usage as high and defers accepts, so the kernel's
    queue fills before any EMFILE. The limit is the cause."""
    p = ev["proxy"]
    d, conf = p["directives"], p.get("config")
    used, most = _peak(p, "fds_in_use"), _peak(p, "max_fds")
    worst = max(ev["procs"].values(), key=lambda pr: pr.get("fd_use", 0), default={})
    if not used:
        # at its cap squid defers every accept, the cache manager's too: /proc holds the same numbers
        used, most = worst.get("fds_open"), worst.get("nofile_soft")
    at_cap = bool(used and most and most - used < 2 * min(100, most // 4) + 5)
    if not at_cap and worst.get("fd_use", 0) < 0.9:
        return None
    v = d.get("max_filedescriptors", {}).get("value", "not set")
    return Finding("squid-fd-limit", "high" if generic.get("accept-queue-overflow") else "medium",
                   f"squid is at its file-descriptor limit ({most}) and stops accepting",
                   {"fds_in_use": used or worst.get("fds_open"), "max_fds": most,
                    "source": (p.get("stats_after") or {}).get("source") or "/proc fd count (cache manager silent)",
                    "reserve": min(100, most // 4) if most else None,
                    "max_filedescriptors": v, "where": _where(d, "max_filedescriptors", conf),
                    "kernel_symptom": _kernel_symptom(generic)},
                   fd_fix(p), impact=1e6)


OWN_CAP = {"squid": squid_fd_limit, "haproxy": haproxy_maxconn, "varnish": varnish_threads, "nginx": nginx_worker_connections,
           "trafficserver": ats_throttle}


def _set_or_raise(d: dict, name: str, conf: str | None, wanted: int) -> str:
    if d.get(name, {}).get("value"):
        return f"raise `{name} {d[name]['value']}` ({_where(d, name, conf)}) to {wanted}"
    return f"set `{name} {wanted}` in {conf} (not set now: the limit the process started with applies)"


def fd_fix(p: dict) -> str | None:
    """The fd directive of this proxy with where it is set and its value, for fd-exhaustion/low-nofile."""
    d, conf, kind = p["directives"], p.get("config"), p["kind"]
    if kind == "nginx":
        return (_set_or_raise(d, "worker_rlimit_nofile", conf, 65536) + ", keeping worker_connections below it; "
                "the service's LimitNOFILE with it (profile linux/nginx)")
    if kind == "squid":
        return (_set_or_raise(d, "max_filedescriptors", conf, 65536) + " and the service's LimitNOFILE with it "
                "(profile linux/squid); squid -k reconfigure does not raise it: restart squid")
    if kind == "haproxy":
        v = d.get("maxconn", {}).get("value", "not set")
        return (f"haproxy sizes its fds from `maxconn {v}` ({_where(d, 'maxconn', conf)}): keep the hard fd "
                "limit at 2 x maxconn + reserve (profile linux/haproxy: LimitNOFILE 131072); do not set ulimit-n "
                "below that")
    if kind == "varnish":
        return ("raise varnish's LimitNOFILE (Debian's unit has 131072; profile linux/varnish) and restart it: "
                "varnishd passes its limit to the cache child")
    if kind == "trafficserver":
        return ("raise trafficserver's LimitNOFILE (profile linux/trafficserver: 65536) above 2 x "
                f"connections_throttle ({d.get('proxy.config.net.connections_throttle', {}).get('value')}); "
                "proxy.config.system.file_max_pct caps what it uses of fs.file-max")
    return None


def refine(found: list[Finding], ev: dict) -> list[Finding]:
    """The generic findings with the proxy's own cap first, and fixes in the proxy's terms."""
    p = ev.get("proxy")
    if not p:
        return found
    generic = {f.id: f for f in found}
    rule = OWN_CAP.get(p["kind"])
    own = rule(ev, generic) if rule else None
    out = [own] if own else []
    for f in found:
        if own and own.evidence.get("kernel_symptom") and f.id == "accept-queue-overflow":
            continue                      # it is the evidence of the proxy's own cap now
        if f.id in ("fd-exhaustion", "low-nofile-limit") and (fix := fd_fix(p)):
            f.fix = fix + (" (the system-wide fs.file-max is the limit here)" if "ENFILE" in str(f.evidence) else "")
        out.append(f)
    return out

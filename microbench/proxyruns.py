"""`bench proxy --proxy nginx|haproxy|varnish|trafficserver`: the same
PolyMix-like load as for Squid (proxybench._drive), against each proxy's
stores started here from Debian's packages. Hit ratios come from the
proxy's own counters where it has them (varnishstat, Traffic Server's
/_stats), else from the X-Cache header every generated config sets.
"""

import contextlib
import json
import urllib.request

from proxytune.core.errors import ProxytuneError

from . import proxyservers

PROXIES = ("squid", "nginx", "haproxy", "varnish", "trafficserver")
SERVICES = {"squid": "squid", "nginx": "nginx", "haproxy": "haproxy", "varnish": "varnish",
            "trafficserver": "trafficserver"}         # Debian's unit names
STORES = {"squid": ["ufs", "aufs", "rock"], "nginx": ["proxy_cache"], "haproxy": ["cache"], "varnish": ["malloc", "file"],
          "trafficserver": ["file", "raw"]}
OPTIONAL_STORES = {"squid": ["diskd"]}      # run only when asked for
STORE_NAMES = sorted({s for v in [*STORES.values(), *OPTIONAL_STORES.values()] for s in v})


def runs_for(proxies: list[str], stores: list[str] | None) -> list[tuple[str, str]]:
    """(proxy, store) pairs in the order asked; 'all' is every proxy. Given stores pick among each
    proxy's own; a proxy none of them belongs to runs all of its stores."""
    if "all" in proxies:
        proxies = list(PROXIES)
    out = []
    for p in proxies:
        if p not in PROXIES:
            raise ProxytuneError(f"unknown proxy {p!r}", f"one of {', '.join(PROXIES)} or all")
        own = STORES[p] + OPTIONAL_STORES.get(p, [])
        out += [(p, s) for s in ([s for s in stores or [] if s in own] or STORES[p])]
    unused = [s for s in stores or [] if not any(s == r[1] for r in out)]
    if unused:
        raise ProxytuneError(f"store {unused[0]!r} is not a store of {', '.join(proxies)}",
                             "; ".join(f"{p}: {', '.join(STORES[p])}" for p in proxies))
    return out


@contextlib.contextmanager
def start(proxy: str, store: str, plan: dict, origin_port: int, nofile: tuple | None):
    """The proxy with this store; Traffic Server's raw store gets a loop device of its own."""
    mb = plan["cache_mb"]
    if proxy == "nginx":
        with proxyservers.NginxCache(origin_port, mb, nofile=nofile) as s:
            yield s
    elif proxy == "haproxy":
        with proxyservers.HAProxy(origin_port, cache_mb=min(mb, 4095), nofile=nofile) as s:
            yield s
    elif proxy == "varnish":
        with proxyservers.Varnish(origin_port, store, mb, nofile=nofile) as s:
            yield s
    elif store == "raw":
        from .devices import Sandbox
        with Sandbox() as sb:
            with proxyservers.TrafficServer(origin_port, raw_device=sb.loop(mb, "ats-raw"), nofile=nofile) as s:
                yield s
    else:
        with proxyservers.TrafficServer(origin_port, cache_mb=mb, nofile=nofile) as s:
            yield s


def counters(proxy: str, server) -> dict | None:
    """Hits and misses the proxy counted itself, or None when it has no counter we read."""
    if proxy == "varnish":
        st = server.stats()
        return {"hits": st.get("MAIN.cache_hit", 0), "misses": st.get("MAIN.cache_miss", 0)}
    if proxy == "trafficserver":
        return ats_hits(ats_stats(server.port))
    return None


# Varnish's own counts of what it failed to serve (varnish-counters(7)): a fetch that failed (a streamed
# body is then cut short, which the client sees as a read error), a fetch that could not get storage
# after nuke_limit evictions, sessions dropped for want of a thread, sessions closed on an error.
VARNISH_FAILURES = ("MAIN.fetch_failed", "MAIN.n_lru_limited", "MAIN.sess_dropped", "MAIN.sess_closed_err")


def failures(proxy: str, server) -> dict | None:
    """Failures the proxy counted itself, or None when we read no such counter for it."""
    if proxy != "varnish":
        return None
    st = server.stats()
    return {k: st.get(k, 0) for k in VARNISH_FAILURES}


def ats_stats(port: int) -> dict:
    """Traffic Server's counters from the stats_over_http plugin (values are strings)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stats", timeout=10) as r:
        return json.loads(r.read()).get("global", {})


def ats_hits(g: dict) -> dict:
    num = lambda k: int(float(g.get(k, 0) or 0))
    hits = sum(num(k) for k in g if k.startswith("proxy.process.http.cache_hit_") and "_mem_" not in k)
    misses = sum(num(k) for k in g if k.startswith("proxy.process.http.cache_miss_"))
    return {"hits": hits, "misses": misses}


def run_proxy(proxy: str, store: str, plan: dict, origin_port: int, workdir, nofile=None, progress=None) -> dict:
    from . import proxybench
    with start(proxy, store, plan, origin_port, nofile) as s:
        limits = proxybench._nofile_of(s.pid)
        mark: dict = {}
        d = proxybench._drive("127.0.0.1", s.port, plan, origin_port, workdir, f"{proxy} {store}", progress,
                              cost_pid=s.pid,
                              on_steady=lambda: mark.update(c=counters(proxy, s), f=failures(proxy, s)))
        after, failed = counters(proxy, s), failures(proxy, s)
    st = d["steady"]
    if after is not None:
        hits, misses = after["hits"] - mark["c"]["hits"], after["misses"] - mark["c"]["misses"]
        source = "varnishstat MAIN.cache_hit/cache_miss" if proxy == "varnish" else "traffic_server /_stats"
    else:
        hits, misses, source = st["x_cache_hits"], st["x_cache_misses"], "X-Cache headers seen by wrk"
    return {"proxy": proxy, "store": store, "nofile": limits, "fill": d["fill"], "steady": st,
            "hit_ratio": hits / (hits + misses) if hits + misses else None, "hit_ratio_from": source,
            "byte_hit_ratio": None, "codes": {}, "errors": proxybench._errors(d, None, None),
            "error_count": d["error_count"], "latency_probe": d["latency_probe"], "cost": d["cost"],
            "proxy_failures": {k: v - mark["f"][k] for k, v in failed.items()} if failed else None}

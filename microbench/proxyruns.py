"""`bench proxy --proxy nginx|haproxy|varnish|trafficserver`: each proxy's
stores (from its module in proxies/), how each is started here from
Debian's packages (LAUNCHERS), and the counters read from it after the
PolyMix-like load (proxybench drives it). Hit ratios come from the
proxy's own counters where it has them (varnishstat, Traffic Server's
/_stats), else from the X-Cache header every generated config sets.
"""

import contextlib
import json
import urllib.request

from proxytune import proxies as registry
from proxytune.core.errors import ProxytuneError

from . import proxyservers, servers

PROXIES = tuple(registry.names())
SERVICES = {k.kind: k.unit for k in registry.KINDS}          # Debian's unit names
STORES = {k.kind: list(k.stores) for k in registry.KINDS}
OPTIONAL_STORES = {k.kind: list(k.optional_stores) for k in registry.KINDS if k.optional_stores}
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


def _squid(store, plan, origin_port, nofile):
    return servers.Squid(store, cache_mb=plan["cache_mb"], mem_mb=plan["mem_mb"], nofile=nofile)


def _nginx(store, plan, origin_port, nofile):
    return proxyservers.NginxCache(origin_port, plan["cache_mb"], nofile=nofile)


def _haproxy(store, plan, origin_port, nofile):
    return proxyservers.HAProxy(origin_port, cache_mb=min(plan["cache_mb"], 4095), nofile=nofile)


def _varnish(store, plan, origin_port, nofile):
    return proxyservers.Varnish(origin_port, store, plan["cache_mb"], nofile=nofile)


@contextlib.contextmanager
def _trafficserver(store, plan, origin_port, nofile):
    """The raw store gets a loop device of its own."""
    if store != "raw":
        with proxyservers.TrafficServer(origin_port, cache_mb=plan["cache_mb"], nofile=nofile) as s:
            yield s
        return
    from .devices import Sandbox
    with Sandbox() as sb:
        with proxyservers.TrafficServer(origin_port, raw_device=sb.loop(plan["cache_mb"], "ats-raw"),
                                        nofile=nofile) as s:
            yield s


# how each proxy is started here for `bench proxy`: (store, plan, origin_port, nofile) -> a context manager
LAUNCHERS = {"squid": _squid, "nginx": _nginx, "haproxy": _haproxy, "varnish": _varnish,
             "trafficserver": _trafficserver}


@contextlib.contextmanager
def start(proxy: str, store: str, plan: dict, origin_port: int, nofile: tuple | None):
    """The proxy with this store, in front of the origin, started as LAUNCHERS says."""
    with LAUNCHERS[proxy](store, plan, origin_port, nofile) as s:
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
        # stats_over_http has once answered with a stray non-UTF-8 byte (a CI run): read it as text
        return json.loads(r.read().decode("utf-8", "replace")).get("global", {})


def ats_hits(g: dict) -> dict:
    num = lambda k: int(float(g.get(k, 0) or 0))
    hits = sum(num(k) for k in g if k.startswith("proxy.process.http.cache_hit_") and "_mem_" not in k)
    misses = sum(num(k) for k in g if k.startswith("proxy.process.http.cache_miss_"))
    return {"hits": hits, "misses": misses}

"""`bench proxy --proxy NAME`: which (proxy, store) pairs run, and each
proxy started and read the way its module in proxies/ says (its stores,
`launch`, and the counters it keeps of its own hits and failures). Hit
ratios come from the proxy's own counters where it has them (its spec's
`hit_ratio_from`), else from the X-Cache header every generated config
sets; proxybench drives the PolyMix-like load.
"""

import contextlib

from proxytune import proxies as registry
from proxytune.core.errors import ProxytuneError

PROXIES = tuple(registry.names())
SERVICES = {k.kind: k.unit for k in registry.KINDS}          # Debian's unit names
STORES = {k.kind: list(k.stores) for k in registry.KINDS}
OPTIONAL_STORES = {k.kind: list(k.optional_stores) for k in registry.KINDS if k.optional_stores}
STORE_NAMES = sorted({s for v in [*STORES.values(), *OPTIONAL_STORES.values()] for s in v})


def runs_for(proxies: list[str], stores: list[str] | None) -> list[tuple[str, str]]:
    """(proxy, store) pairs in the order asked; 'all' is every proxy that has stores. Given stores pick
    among each proxy's own; a proxy none of them belongs to runs all of its stores. A proxy named
    that has no store to bench is refused: benching nothing is no result."""
    if "all" in proxies:
        proxies = [p for p in PROXIES if STORES[p]]
    out = []
    for p in proxies:
        if p not in PROXIES:
            raise ProxytuneError(f"unknown proxy {p!r}", f"one of {', '.join(PROXIES)} or all")
        if not STORES[p]:
            raise ProxytuneError(f"{p} has no store to bench",
                                 f"its module (proxies/) names none; one of {', '.join(q for q in PROXIES if STORES[q])}")
        own = STORES[p] + OPTIONAL_STORES.get(p, [])
        out += [(p, s) for s in ([s for s in stores or [] if s in own] or STORES[p])]
    unused = [s for s in stores or [] if not any(s == r[1] for r in out)]
    if unused:
        raise ProxytuneError(f"store {unused[0]!r} is not a store of {', '.join(proxies)}",
                             "; ".join(f"{p}: {', '.join(STORES[p])}" for p in proxies))
    return out


@contextlib.contextmanager
def start(proxy: str, store: str, plan: dict, origin_port: int, nofile: tuple | None):
    """The proxy with this store, in front of the origin, started as its module says; a store that
    needs a block device of its own gets a loop device for the run."""
    spec = registry.by_kind(proxy)
    with contextlib.ExitStack() as stack:
        device = None
        if store in spec.device_stores:
            from .devices import Sandbox
            device = stack.enter_context(Sandbox()).loop(plan["cache_mb"], f"{proxy}-{store}")
        yield stack.enter_context(spec.launch(store, plan, origin_port, nofile, device))


def counters(proxy: str, server) -> dict | None:
    """Hits and misses the proxy counted itself, or None when it has no counter we read."""
    return registry.by_kind(proxy).counters(server)


def failures(proxy: str, server) -> dict | None:
    """Failures the proxy counted itself, or None when we read no such counter for it."""
    return registry.by_kind(proxy).failures(server)


def hit_ratio_from(proxy: str) -> str | None:
    """What `counters` reads for this proxy, as the result names it."""
    return registry.by_kind(proxy).hit_ratio_from

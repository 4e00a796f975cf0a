"""What to do on this host first: the report's conclusions, ranked, each with its command.

Ranking, highest first: what a watched proxy is running into now (doctor
findings), then settings in drift (a host that fails the profile's floors
drops connections under load), then the choices the benches measured here
(event mechanism, object store), ordered by the factor they measured. Every
item is derived from this report's sections; none is written in advance.
"""

from proxytune.core.console import term_text
from proxytune.probes.findings import SEVERITY_RANK


def from_doctor(doc: dict | None) -> list[dict]:
    out = []
    for f in (doc or {}).get("findings", []):
        evidence = "; ".join(f"{k} {v}" for k, v in list(f.get("evidence", {}).items())[:4])
        out.append({"rank_key": (0, SEVERITY_RANK.get(f["severity"], 1), -f.get("impact", 0.0)),
                    "what": f"{f['id']}: {f['title']}", "why": evidence, "command": f["fix"], "source": "doctor"})
    return out


def from_audit(audit: dict | None) -> list[dict]:
    if not audit:
        return []
    drift = [r for r in audit["settings"] if r["status"] == "drift"]
    errors = [r for r in audit["settings"] if r["status"] == "error"]
    out = []
    if errors:
        out.append({"rank_key": (1, 0), "what": f"{len(errors)} setting(s) cannot be read: "
                    + ", ".join(r["setting"] for r in errors),
                    "why": "; ".join(r["note"] or "" for r in errors)[:200],
                    "command": f"proxytune tune check -p {audit['profile']}", "source": "audit"})
    if drift:
        names = ", ".join(r["setting"] for r in drift[:6]) + (" ..." if len(drift) > 6 else "")
        out.append({"rank_key": (1, 1), "what": f"{len(drift)} setting(s) below profile {audit['profile']}: {names}",
                    "why": f"{len(drift)} of {len(audit['settings'])} settings miss the profile's floors; "
                           f"{drift[0]['setting']}: {drift[0]['reason']}",
                    "command": f"proxytune tune plan -p {audit['profile']} --persist, then "
                               f"proxytune tune apply -p {audit['profile']} --persist --yes", "source": "audit"})
    return out


def epoll_fix() -> str:
    """How each proxy runs on epoll (its module's `epoll`; their documentation: squid ./configure
    --enable-epoll, nginx `events { use epoll; }`, HAProxy and Varnish pick epoll themselves, Traffic
    Server's event system is epoll on Linux): none of them waits for events with io_uring."""
    from proxytune import proxies
    told = [f"{k.kind}: {k.epoll}" for k in proxies.KINDS if k.epoll]
    already = [k.kind for k in proxies.KINDS if not k.epoll]
    return "; ".join(told + ([f"{', '.join(already)} use it already"] if already else []))


NOISE = 0.10        # a median's relative spread assumed when the points carry less


def _within_noise(a: dict, b: dict) -> bool:
    """Two medians are within noise when their 95% intervals overlap or they differ by less than
    the larger relative spread (at least NOISE)."""
    lo_a, hi_a = a.get("ci95", [a["median"]] * 2)
    lo_b, hi_b = b.get("ci95", [b["median"]] * 2)
    spread = max(a.get("iqr_rel", 0.0), b.get("iqr_rel", 0.0), NOISE)
    return (lo_a <= hi_b and lo_b <= hi_a) or abs(a["median"] - b["median"]) < spread * min(a["median"], b["median"])


def from_events(ev: dict | None) -> list[dict]:
    """Leave select/poll for an O(1) mechanism. The action names the mechanism its fix uses: epoll
    (what the proxies offer), and says when io_uring measured no different, or better, here."""
    sc = (ev or {}).get("scaling", {})
    if "poll" not in sc or "epoll" not in sc:
        return []
    n = sc["poll"]["n_large"]
    at = {p["backend"]: p["ns_per_call"] for p in ev["idle"]
          if p["n"] == n and p["k"] == 1 and p["ready"] == "hot" and p["available"]}
    if "epoll" not in at or "poll" not in at:
        return []
    factor = at["poll"]["median"] / at["epoll"]["median"]
    why = (f"at {n:,} idle descriptors one poll() costs {at['poll']['median']:,.0f} ns, epoll "
           f"{at['epoll']['median']:,.0f} ns (x{factor:,.0f}) on this host")
    what = "run the proxy on epoll, not select/poll"
    if "io_uring" in at:
        u = at["io_uring"]
        if _within_noise(u, at["epoll"]):
            what = "run the proxy on epoll, not select/poll (epoll or io_uring: within noise here)"
        if u["median"] < at["epoll"]["median"] and not _within_noise(u, at["epoll"]):
            why += (f"; io_uring {u['median']:,.0f} ns is x{at['epoll']['median'] / u['median']:.1f} cheaper still, "
                    "but no proxy here waits for events with it")
        else:
            why += f"; io_uring {u['median']:,.0f} ns"
    return [{"rank_key": (2, -factor), "what": what, "why": why, "command": epoll_fix(), "source": "bench events"}]


def from_storage(st: dict | None) -> list[dict]:
    combos = [c for c in (st or {}).get("combos", []) if c["available"] and c.get("steady_objects_per_s")]
    ufs = [c for c in combos if c["store"] == "ufs"]
    if not combos or not ufs:
        return []
    best = max(combos, key=lambda c: c["steady_objects_per_s"])
    base = max(ufs, key=lambda c: c["steady_objects_per_s"])
    factor = best["steady_objects_per_s"] / base["steady_objects_per_s"]
    if best["store"] == "ufs" or factor < 1.1:
        return []
    return [{"rank_key": (2, -factor), "what": f"store objects in a {best['store']} store with {best['engine']} I/O",
             "why": f"{best['steady_objects_per_s']:,.0f} obj/s against {base['steady_objects_per_s']:,.0f} for the best "
                    f"file-per-object store ({base['engine']}), x{factor:.1f}, on {best['fs']}",
             "command": "squid: cache_dir rock; trafficserver: storage.config on a raw device or one large file",
             "source": "bench storage"}]


def build(sections: dict) -> list[dict]:
    """Ranked actions, each {rank, what, why, command, source}."""
    from .measurements import MEASUREMENTS
    items = [item for m in MEASUREMENTS if m.summary for item in m.summary(sections.get(m.name))]
    items.sort(key=lambda i: i["rank_key"])
    return [{"rank": n, **{k: v for k, v in i.items() if k != "rank_key"}} for n, i in enumerate(items, 1)]


def terminal_lines(doc: dict) -> list[str]:
    """What `report` prints when it is done: the five first items, each with why and what to run,
    then each seed's verdict (a result's text shown inert)."""
    lines = []
    for item in doc["data"]["summary"][:5]:
        what, why, do = (term_text(item[k], markup=False) for k in ("what", "why", "command"))
        lines.append(f"{item['rank']}. {what}\n   why: {why}\n   do:  {do}")
    for row in doc["data"]["sections"]["seeds"]["rows"]:
        lines.append(term_text(f"seed: {row['seed']}: {row['verdict']} ({row['reason']})", markup=False))
    return lines


def audit_lines(audit: dict) -> list[str]:
    """The audit's verdict (settings by status) and what to run, printed before the benchmarks start."""
    counts = {}
    for r in audit["settings"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines = [term_text(f"host: profile {audit['profile']}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
                       markup=False)]
    for item in from_audit(audit):
        what, do = (term_text(item[k], markup=False) for k in ("what", "command"))
        lines.append(f"  {what}\n  do: {do}")
    return lines

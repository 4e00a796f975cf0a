"""Findings in the watched proxy's own terms. The generic rules
(findings.py) see the kernel's symptoms; the proxy's module (proxies/)
gives its caps as data, and the one rule in owncap.py makes a cap the
finding when the proxy holds it, with the kernel's symptom as evidence.
Fixes of generic findings (fd limits, ephemeral ports) are rewritten in the
proxy's own terms: its directive, where it is set, its value. Reads only
the evidence dict (doctor.gather) and the generic findings, so it is
testable on recorded evidence. An unknown proxy keeps the generic advice.
"""

from proxytune import proxies as kinds

from . import owncap
from .findings import Finding

CPU_BOUND_MIN_CORES = 0.9     # a proxy using at least this much of a core is saturated
OWN_CODE_DOMINATES = 0.5      # one function of the proxy's own code with half its samples is the place to look


def caps(ev: dict) -> list[owncap.Cap]:
    p = ev.get("proxy")
    kind = kinds.by_kind(p["kind"]) if p else None
    return kind.caps(ev) if kind else []


def own_findings(ev: dict, generic: dict) -> list[Finding]:
    """The proxy's caps it holds, most pressing first (one per finding id)."""
    out: dict[str, Finding] = {}
    for cap in caps(ev):
        f = owncap.finding(cap, ev, generic)
        if f and (f.id not in out or f.impact > out[f.id].impact):
            out[f.id] = f
    return sorted(out.values(), key=lambda f: (f.severity != "high", -f.impact))


def fd_fix(p: dict) -> str | None:
    kind = kinds.by_kind(p["kind"])
    return kind.fd_fix(p) if kind else None


# generic finding -> the proxy spec's hook that words its fix in the proxy's own terms (proxies/base.py)
OWN_FIX = {"accept-queue-overflow": "backlog_fix", "syn-backlog-overflow": "backlog_fix",
           "file-per-object-churn": "churn_fix", "blocking-disk-io": "disk_fix"}


def kind_fix(p: dict, name: str | None) -> str | None:
    kind = kinds.by_kind(p["kind"])
    return getattr(kind, name)(p) if kind and name else None


def refine(found: list[Finding], ev: dict) -> list[Finding]:
    """The generic findings with the proxy's own cap first, and fixes in the proxy's terms."""
    p = ev.get("proxy")
    if not p:
        return found
    generic = {f.id: f for f in found}
    own = own_findings(ev, generic)
    out = list(own)
    for f in found:
        if own and f.id in owncap.KERNEL_SYMPTOMS:
            continue                      # it is the evidence of the proxy's own cap now
        if f.id in ("fd-exhaustion", "low-nofile-limit") and (fix := fd_fix(p)):
            f.fix = fix + (" (the system-wide fs.file-max is the limit here)" if "ENFILE" in str(f.evidence) else "")
        if f.id == "ephemeral-port-exhaustion" and (fix := kind_fix(p, "port_fix")):
            f.fix = f"{fix}; or widen net.ipv4.ip_local_port_range (now {ev.get('port_range')})"
        own_fix = kind_fix(p, OWN_FIX.get(f.id))
        if own_fix:
            f.fix = own_fix + ("; keep net.ipv4.tcp_syncookies = 1" if OWN_FIX[f.id] == "backlog_fix" else "")
        out.append(f)
    return out


def cpu_bound(found: list[Finding], ev: dict) -> list[Finding]:
    """`cpu-hotspot` alone on a saturated proxy is the proxy being CPU-bound, told with its CPU split,
    unless one function of the proxy's own code dominates (then it stays a hotspot)."""
    if [f.id for f in found if f.severity in ("high", "medium")] != ["cpu-hotspot"]:
        return found
    hot = next(f for f in found if f.id == "cpu-hotspot")
    own = hot.evidence.get("hot_own_code") or []
    if (own and own[0].get("share", 0) >= OWN_CODE_DOMINATES) or (ev.get("cpu_cores") or 0) < CPU_BOUND_MIN_CORES:
        return found
    bound = Finding("cpu-bound", "medium", "the proxy is CPU-bound: no cap or kernel limit holds it back",
                    {"cpu_cores": round(ev.get("cpu_cores") or 0, 3), "cpu_split": hot.evidence.get("split"),
                     "top_functions": hot.evidence.get("hot_self"), "top_own_code": own},
                    "add cores or workers (nginx worker_processes auto, haproxy nbthread, squid workers), or "
                    "spend less per request (TLS session reuse, fewer regex rules, caching); the split says "
                    "whether the kernel (network stack, syscalls) or the proxy's own code takes the time",
                    impact=hot.impact)
    return [bound if f is hot else f for f in found]

"""What the doctor watches: which proxy a pid is and how to audit it. Each
proxy is one module in proxies/ (its recognition, config with includes,
statistics, caps and fixes); this is the doctor's door to that registry.

    target = identify(pid)            # None for a process we do not know
    target.describe()                 # kind, exe, argv, config file(s), directives with file:line
    target.stats()                    # {"available": bool, ...counters}

Everything read comes from a process we do not trust: every file its argv
or config names is read as that process would read it (targetread), never
written, never followed into a shell; a socket or port is contacted only
when the target holds it, with one fixed request and one total deadline.
"""

from proxytune.core.numbers import leading_uint as as_number  # noqa: F401  (kept for callers)

from proxytune.proxies import KINDS, by_kind, identify, names  # noqa: F401
from proxytune.proxies.base import (STATS_SECONDS, Running, Spec, argv_of, as_int, directives, option,  # noqa: F401
                                    read_config)
from proxytune.proxies.trafficserver import logged_at  # noqa: F401
from proxytune.proxies.varnish import RunningVarnish  # noqa: F401


def audit_as(target: Running | None, profile_ref: str, comm: str) -> tuple[str, str]:
    """(profile, service) for the host audit: a known proxy is audited under its Debian unit name
    (varnishd's unit is varnish, traffic_server's is trafficserver) and, in place of the generic
    default, its own profile."""
    if target is None:
        return profile_ref, comm
    from proxytune.tune.profile import PROFILES_DIR
    own = target.profile()
    if profile_ref == "linux/proxy" and (PROFILES_DIR / f"{own}.toml").is_file():
        profile_ref = own
    return profile_ref, target.unit or target.kind

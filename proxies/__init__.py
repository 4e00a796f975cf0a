"""The registry of proxies the tool knows: one module per proxy (see base.py
for what a module says). The doctor, profile detection, `bench proxy`, the
storage question and the CLI's choices iterate KINDS; a sixth proxy is one
module here, one profile TOML and its tests."""

from pathlib import Path

from proxytune.core import procfs, proxytree

from .base import Proxy, argv_of
from .haproxy import HAProxy
from .nginx import Nginx
from .squid import Squid
from .trafficserver import TrafficServer
from .varnish import Varnish

KINDS: tuple[type[Proxy], ...] = (Squid, Nginx, HAProxy, Varnish, TrafficServer)   # the order of `--proxy all`


def names() -> list[str]:
    return [k.kind for k in KINDS]


def by_kind(name: str) -> type[Proxy] | None:
    return next((k for k in KINDS if k.kind == name), None)


def identify(pid: int) -> Proxy | None:
    """The proxy running as pid, by the basename of its executable (comm is renamed by some)."""
    exe = procfs.exe_of(pid)
    if exe is None:
        return None
    name = Path(exe.removesuffix(" (deleted)")).name
    for cls in KINDS:
        if name in cls.exe_names:
            return cls(pid, exe, argv_of(pid))
    return None


def identity(cls: type[Proxy]) -> proxytree.Identity:
    """How core.proxytree tells this proxy's processes from a namesake: its executables and unit."""
    return proxytree.Identity(cls.kind, cls.exe_names, cls.unit, cls.managers)


def identity_for(name: str) -> proxytree.Identity:
    """The proxy a service, unit or executable name means; a name the registry lacks is a service
    of that name whose executable is called so too (a --service of the operator's own)."""
    for cls in KINDS:
        if name in (cls.kind, cls.unit, *cls.exe_names):
            return identity(cls)
    return proxytree.Identity(name, (name,), name)


def identities_for(comm: str) -> list[proxytree.Identity]:
    """Every proxy whose service may hold a process named `comm` (varnish's cache-main, Traffic
    Server's [TS_MAIN]): the registry's, and a service called `comm` when it is none of theirs."""
    known = [identity(cls) for cls in KINDS]
    return known + ([] if any(comm in i.exe_names for i in known) else [proxytree.Identity(comm, (comm,), comm)])

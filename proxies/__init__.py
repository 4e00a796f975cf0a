"""The registry of proxies the tool knows: one module per proxy (see base.py
for the three roles a module fills in). Every module of this package but
the shared ones (INFRASTRUCTURE) is a proxy and is found here by itself,
placed by its Spec's `order`. The doctor, profile detection, `bench proxy`,
the storage question, the CLI's choices and the launcher's package list
iterate KINDS; a sixth proxy is one module here, one profile TOML and its
tests. A module that leaves out a piece the others rely on fails here, at
import, naming what is missing."""

import importlib
import pkgutil
from pathlib import Path

from proxytune.core import procfs, proxytree

from .base import Running, Spec, argv_of

INFRASTRUCTURE = frozenset({"base", "cap", "launch", "timing"})    # modules here that are no proxy


def check(spec: type[Spec]) -> type[Spec]:
    """The spec, or ImportError naming what it lacks."""
    where = f"{spec.__module__}.{spec.__name__}"
    missing = [a for a in ("kind", "exe_names", "unit", "user", "package") if not getattr(spec, a)]
    if spec.kind == Spec.kind:
        missing.append("kind")
    process = getattr(spec, "process", None)
    if not (isinstance(process, type) and issubclass(process, Running)):
        missing.append("process (its Running class: `class X(Spec, process=RunningX)`)")
    if spec.stores and spec.launch is Spec.launch:
        missing.append("launch (it has stores to bench)")
    if (spec.counters is Spec.counters) != (spec.hit_ratio_from is None):
        missing.append("counters and hit_ratio_from (one names what the other reads)")
    stray = set(spec.device_stores) - set(spec.stores + spec.optional_stores)
    stray |= set(spec.store_design) - set(spec.stores + spec.optional_stores)
    if missing or stray:
        raise ImportError(f"proxy {where}: " + "; ".join(
            [f"missing {', '.join(dict.fromkeys(missing))}"] * bool(missing) +
            [f"not one of its stores: {', '.join(sorted(stray))}"] * bool(stray)))
    return spec


def _discover() -> tuple[type[Spec], ...]:
    """The Spec of every proxy module here, each checked, in their `order`."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name in INFRASTRUCTURE or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        specs = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, Spec)
                 and v.__module__ == module.__name__]
        if len(specs) != 1:
            raise ImportError(f"proxies/{info.name}.py must define one Spec (a proxy), not {len(specs)}")
        found.append(check(specs[0]))
    kinds = [s.kind for s in found]
    if len(set(kinds)) != len(kinds):
        raise ImportError(f"two proxy modules name the same kind: {sorted(kinds)}")
    return tuple(sorted(found, key=lambda s: (s.order, s.kind)))


KINDS: tuple[type[Spec], ...] = _discover()      # in `order`: that of `--proxy all` and of detection


def names() -> list[str]:
    return [k.kind for k in KINDS]


def by_kind(name: str) -> type[Spec] | None:
    return next((k for k in KINDS if k.kind == name), None)


def for_service(name: str) -> type[Spec] | None:
    """The proxy a service or process name stands for (its kind, unit or executable)."""
    return next((k for k in KINDS if name in (k.kind, k.unit, *k.exe_names)), None)


def packages(kinds: list[str]) -> list[str]:
    """The Debian packages of these proxies ('all': every one), for what installs them."""
    return [k.package for k in KINDS if k.kind in kinds or "all" in kinds]


def identify(pid: int) -> Running | None:
    """The proxy running as pid, by the basename of its executable (comm is renamed by some)."""
    exe = procfs.exe_of(pid)
    if exe is None:
        return None
    name = Path(exe.removesuffix(" (deleted)")).name
    for spec in KINDS:
        if name in spec.exe_names:
            return spec.process(pid, exe, argv_of(pid))
    return None


def identity(cls: type[Spec]) -> proxytree.Identity:
    """How core.proxytree tells this proxy's processes from a namesake: its executables and unit."""
    return proxytree.Identity(cls.kind, cls.exe_names, cls.unit, cls.managers)


def identity_for(name: str) -> proxytree.Identity:
    """The proxy a service, unit or executable name means; a name the registry lacks is a service
    of that name whose executable is called so too (a --service of the operator's own)."""
    spec = for_service(name)
    return identity(spec) if spec else proxytree.Identity(name, (name,), name)


def identities_for(comm: str) -> list[proxytree.Identity]:
    """Every proxy whose service may hold a process named `comm` (varnish's cache-main, Traffic
    Server's [TS_MAIN]): the registry's, and a service called `comm` when it is none of theirs."""
    known = [identity(cls) for cls in KINDS]
    return known + ([] if any(comm in i.exe_names for i in known) else [proxytree.Identity(comm, (comm,), comm)])

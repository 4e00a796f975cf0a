"""The layers of DESIGN.md, kept at package level:

    core <- proxies <- {tune, microbench, probes} <- reports <- commands/ <- cli.py

A package imports only packages to its left. Among the middle three, tune
imports neither probes nor microbench (a `tune` command never loads the
doctor's rules or a benchmark), and probes and microbench do not import each
other: what they share lives in the proxy layer or in core. probes and
microbench may use tune (the doctor runs the host audit; a bench applies a
profile). Every import counts, at module level or inside a function, absolute
(`proxytune.tune`, `tune`) or relative (`from ..tune import x`)."""

import ast
from pathlib import Path

from conftest import REPO

RANK = {"core": 0, "proxies": 1, "tune": 2, "microbench": 2, "probes": 2, "reports": 3, "commands": 4, "cli": 5}
SAME_RANK_ALLOWED = {("probes", "tune"), ("microbench", "tune")}
# (file, package it imports) that break the rule today, each to be removed; a stale entry fails too
KNOWN: set[tuple[str, str]] = set()

def package_of(rel: Path) -> str | None:
    top = rel.parts[0]
    if top == "cli.py":
        return "cli"
    return top if top in RANK and len(rel.parts) > 1 else None


def imported_packages(source: str, rel: Path) -> set[str]:
    """The top-level packages of the project a file imports, anywhere in it."""
    here = list(rel.parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            # `from proxytune import tune`, `from .. import tune`: the names are the packages
            names = [f"{mod}.{a.name}".strip(".") for a in node.names] if mod in ("", "proxytune") else [mod]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "proxytune":
                parts = parts[1:]
            if parts and parts[0] in RANK:
                out.add(parts[0])
    return out


def edges() -> dict[tuple[str, str], str]:
    """(file, package it imports) -> the file's own package, for every cross-package import."""
    out = {}
    files = [REPO / "cli.py"] + [p for pkg in RANK if pkg != "cli" for p in sorted((REPO / pkg).rglob("*.py"))]
    for path in files:
        rel = path.relative_to(REPO)
        src = package_of(rel)
        if src is None or "fleet_callback" in rel.parts:    # the Ansible callback runs inside ansible-playbook
            continue
        for dst in imported_packages(path.read_text(), rel) - {src}:
            out[(str(rel), dst)] = src
    return out


def allowed(src: str, dst: str) -> bool:
    return RANK[dst] < RANK[src] or (src, dst) in SAME_RANK_ALLOWED


def test_the_scanner_sees_every_form_of_import():
    rel = Path("probes/x.py")
    src = ("import os\nfrom proxytune.core import procfs\nfrom .. import tune\n"
           "def f():\n    from ..microbench import build\n    import proxytune.reports.build\n"
           "from proxytune import proxies\nfrom . import doctor\n")
    assert imported_packages(src, rel) == {"core", "tune", "microbench", "reports", "proxies", "probes"}
    assert imported_packages("from .base import Proxy\n", Path("proxies/squid.py")) == {"proxies"}


def test_every_package_imports_only_the_layers_below_it():
    found = edges()
    assert {src for (_, _), src in found.items()} >= {"proxies", "tune", "probes", "microbench", "reports", "commands",
                                                      "cli"}
    bad = sorted(f"{f} ({found[(f, d)]}) imports {d}" for f, d in found
                 if not allowed(found[(f, d)], d) and (f, d) not in KNOWN)
    assert not bad, "\n".join(bad)


def test_the_proxy_layer_imports_only_core():
    assert {d for (f, d), src in edges().items() if src == "proxies"} == {"core"}


def test_tune_loads_neither_the_doctor_nor_a_benchmark():
    assert not {(f, d) for (f, d), src in edges().items() if src == "tune" and d in ("probes", "microbench")}


def test_known_exceptions_are_still_there():
    """An exception that was fixed leaves this list, so the list says what is left to do."""
    assert not KNOWN - set(edges()), sorted(KNOWN - set(edges()))

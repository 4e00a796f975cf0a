"""Test tiers: the markers `host`, `proxy` and `slow`, put on each test from the gates and
fixtures it already uses, so no test file has to list its own tier (and a new test gets one).

- host:  needs root, changes or reads the host, or starts any program: a skip gate that says
         "root" (needs_root and its kin), a fixture or helper from tests/ whose code starts a
         process (subprocess, os.fork/system, the conftest helpers proxytune/in_netns/as_nobody,
         loop_ext4), or a reference to IS_ROOT.
- proxy: starts a real proxy or server: the bench launchers (proxies.launch, microbench.servers,
         microbench.proxyservers), tests/servers/*, wrk, sshd (the fleet's hosts), or a skip gate
         naming a proxy's binary.
- slow:  a file whose tests took over ~20 s in CI's --durations (SLOW_FILES).

`make test-fast` (-m "not host and not proxy and not slow") is then pure Python in one process;
with PROXYTUNE_TEST_FAST=1 (make test-fast sets it) a test that starts a process anyway fails,
naming the program, instead of passing unmarked: the tier cannot drift from what it promises.
The markers are registered in pyproject.toml (--strict-markers: a misspelt tier is an error).
"""

import os
import sys
import types
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# CI's --durations, per file (seconds, the last full runs on the project's VM).
SLOW_FILES = {
    "test_matrix_owncap.py": 533, "test_matrix_generic.py": 356, "test_adversarial_fleet.py": 280,
    "test_probes.py": 274, "test_cli.py": 212, "test_fleet.py": 164,
}

# What in a test's code (or its helpers' and fixtures' code, within tests/) means it starts a program
# or needs root: names it loads, and the modules those names come from.
PROCESS_NAMES = {"subprocess", "Popen", "fork", "forkpty", "system", "posix_spawn", "execv", "execve", "execvp",
                 "execvpe", "spawnv", "multiprocessing", "pty", "IS_ROOT", "needs_root"}
# ... and that it starts a server: the launchers' modules, and strings naming a server it runs.
SERVER_NAMES = {"proxyservers", "servers", "launch", "SERVERS", "start_slow_origin", "SlowOrigin",
                "namespace_hosts", "wrk", "wrk_background", "loopserver"}
SERVER_STRINGS = ("sshd", "wrk", "loopserver", "fakeproxy", "slow_origin", "nsload", "portclient", "/usr/sbin/",
                  "traffic_server", "tests/servers")
PROXY_WORDS = ("nginx", "squid", "haproxy", "varnish", "trafficserver", "traffic_server", "wrk", "sshd")


def _in_tests(path) -> bool:
    return bool(path) and Path(path).resolve().is_relative_to(TESTS)


def _ours(obj) -> bool:
    code = getattr(obj, "__code__", None)
    return code is not None and _in_tests(code.co_filename)


def _class_ours(cls) -> bool:
    return _in_tests(getattr(sys.modules.get(cls.__module__), "__file__", None))


def _methods(cls) -> list:
    """A class's functions, classmethods, staticmethods and properties, as plain functions."""
    out = []
    for member in vars(cls).values():
        member = getattr(member, "__func__", None) or getattr(member, "fget", None) or member
        if _ours(member):
            out.append(member)
    return out


def _codes(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def signs(func, seen: set | None = None) -> tuple[set[str], set[str]]:
    """Names and strings in func's code and in every function or class of tests/ it reaches by name."""
    seen = set() if seen is None else seen
    names, strings = set(), set()
    if id(func) in seen or not _ours(func):
        return names, strings
    seen.add(id(func))
    found = [c for c in _codes(func.__code__)]
    for code in found:
        names.update(code.co_names)
        strings.update(c for c in code.co_consts if isinstance(c, str))
    scope = func.__globals__
    for name in list(names):
        target = scope.get(name, sys.modules.get(name))   # a global, or a module imported in the function
        reached = []
        if isinstance(target, types.ModuleType) and _in_tests(getattr(target, "__file__", None)):
            reached = [getattr(target, n) for n in names if hasattr(target, n)]
        elif isinstance(target, type) and _class_ours(target):
            reached = _methods(target)
        elif callable(target):
            reached = [target]
        reached = [m for r in reached for m in (_methods(r) if isinstance(r, type) and _class_ours(r) else [r])]
        for r in reached:
            more_names, more_strings = signs(r, seen)
            names |= more_names
            strings |= more_strings
    return names, strings


def _gate_reasons(item) -> list[str]:
    return [str(m.kwargs.get("reason", "")).lower() for m in item.iter_markers() if m.name in ("skipif", "skip")]


def _fixture_funcs(item):
    info = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames:
        defs = info.name2fixturedefs.get(name) if info else None
        if defs:
            yield defs[-1].func


def tiers(item) -> set[str]:
    """The tiers one collected test belongs to."""
    names, strings = set(), set()
    for func in (getattr(item, "function", None), *_fixture_funcs(item)):
        if func is not None:
            n, s = signs(func)
            names |= n
            strings |= s
    reasons = _gate_reasons(item)
    found = set()
    if names & PROCESS_NAMES or any("root" in r for r in reasons):
        found.add("host")
    if names & SERVER_NAMES or any(w in s for s in strings for w in SERVER_STRINGS) or \
            any(w in r for r in reasons for w in PROXY_WORDS):
        found |= {"proxy", "host"}
    if Path(str(item.fspath)).name in SLOW_FILES:
        found.add("slow")
    return found


def mark(items) -> None:
    for item in items:
        for tier in sorted(tiers(item) - {m.name for m in item.iter_markers()}):
            item.add_marker(getattr(pytest.mark, tier))


# --- the fast tier's own check: nothing it runs starts a program -------------------------------------

_GUARDED = {"on": False}
_EVENTS = ("subprocess.Popen", "os.system", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn")


def _refuse(event: str, args) -> None:
    if _GUARDED["on"] and event in _EVENTS:
        what = args[1] if event == "subprocess.Popen" else args
        raise RuntimeError(f"{event} {what!r}: this test starts a program, so it belongs to the host tier "
                           "(use a gate or fixture tests/tiers.py knows, or mark it pytest.mark.host)")


def guard_fast_tier() -> bool:
    """With PROXYTUNE_TEST_FAST=1: a test marked neither host nor proxy that starts a program (in its
    setup, call or teardown, directly or through the product) fails, naming the program."""
    if os.environ.get("PROXYTUNE_TEST_FAST") != "1":
        return False
    sys.addaudithook(_refuse)
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Guard a test of the fast tier (neither host nor proxy) from its setup to its teardown."""
    _GUARDED["on"] = os.environ.get("PROXYTUNE_TEST_FAST") == "1" and \
        not any(m.name in ("host", "proxy") for m in item.iter_markers())
    try:
        yield
    finally:
        _GUARDED["on"] = False

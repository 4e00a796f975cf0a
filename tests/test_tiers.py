"""The test tiers (tests/tiers.py): a test gets host, proxy and slow from the gates and fixtures it
uses, the markers are registered strictly, and the fast tier's guard refuses to start a program."""

import subprocess
import tomllib
import types

import pytest

import tiers
from conftest import REPO


def _starts_a_program():
    subprocess.run(["true"], check=True)


def _through_a_helper():
    return _starts_a_program()


def _starts_a_server():
    from proxytune.microbench import servers
    return servers.Nginx()


def _pure():
    return sorted({3, 1, 2})


class _Helper:
    @classmethod
    def take(cls):
        return _through_a_helper()


def _through_a_classmethod():
    return _Helper.take()


# Reached only through this dict, which tiers does not follow: these tests stay in the fast tier.
SAMPLES = {f.__name__: f for f in (_starts_a_program, _through_a_helper, _starts_a_server, _pure,
                                   _through_a_classmethod)}

GATES = {"root": pytest.mark.skipif(False, reason="needs root (network namespaces)"),
         "nginx": pytest.mark.skipif(False, reason="needs nginx and wrk")}


def item(func, *marks, fixtures=(), file="test_x.py"):
    """A stand-in for a collected test: what tiers() reads of one."""
    defs = {name: [types.SimpleNamespace(func=f)] for name, f in fixtures}
    return types.SimpleNamespace(function=func, fspath=f"/tmp/{file}", fixturenames=[n for n, _ in fixtures],
                                 _fixtureinfo=types.SimpleNamespace(name2fixturedefs=defs),
                                 iter_markers=lambda: iter(m.mark for m in marks))


def test_a_pure_test_has_no_tier():
    assert tiers.tiers(item(SAMPLES["_pure"])) == set()


def test_starting_a_program_directly_through_a_helper_or_a_class_is_host():
    for name in ("_starts_a_program", "_through_a_helper", "_through_a_classmethod"):
        assert tiers.tiers(item(SAMPLES[name])) == {"host"}, name


def test_a_fixture_that_starts_a_program_makes_its_test_host():
    assert tiers.tiers(item(SAMPLES["_pure"], fixtures=[("made", SAMPLES["_through_a_helper"])])) == {"host"}


def test_a_root_gate_is_host_and_a_proxy_gate_is_proxy():
    assert tiers.tiers(item(SAMPLES["_pure"], GATES["root"])) == {"host"}
    assert tiers.tiers(item(SAMPLES["_pure"], GATES["nginx"])) == {"host", "proxy"}


def test_a_bench_launcher_is_proxy():
    assert tiers.tiers(item(SAMPLES["_starts_a_server"])) == {"host", "proxy"}


def test_a_file_slow_in_ci_is_slow():
    assert tiers.tiers(item(SAMPLES["_pure"], file="test_matrix_owncap.py")) == {"slow"}


def test_the_tiers_are_registered_strictly():
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in ini["addopts"].split()
    assert {m.split(":")[0] for m in ini["markers"]} == {"host", "proxy", "slow"}
    assert '-m "not host and not proxy and not slow"' in (REPO / "Makefile").read_text()


def test_the_guard_refuses_a_program_only_while_it_is_on():
    tiers._GUARDED["on"] = True
    try:
        with pytest.raises(RuntimeError, match=r"subprocess.Popen \['cc'\].*host tier"):
            tiers._refuse("subprocess.Popen", ("cc", ["cc"], None, None))
        with pytest.raises(RuntimeError, match="os.fork"):
            tiers._refuse("os.fork", ())
        tiers._refuse("open", ("/etc/hostname", "r", 0))          # reading a file is not starting a program
    finally:
        tiers._GUARDED["on"] = False
    tiers._refuse("subprocess.Popen", ("cc", ["cc"], None, None))

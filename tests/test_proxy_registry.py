"""The proxy registry (proxies/): every module there is a proxy, checked at
import; a sixth proxy is one module, one profile TOML and its tests. Shown
with a dummy proxy added to a copy of the checkout as ONE new module (and its
profile): recognition, the doctor's caps and fixes, tune's detection, the
bench launcher, the CLI's choices and the launcher's package list all pick
it up (and the report's advice on event loops), and nothing else is edited."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from proxytune import proxies
from proxytune.core.errors import ProxytuneError
from proxytune.microbench import proxyruns
from proxytune.proxies import base

DUMMY = '''"""Dummy: a proxy for the registry's test (max_clients, its stats page, an in-memory store)."""

import sys

from .base import Running, Spec, directives, peak, where
from .cap import Cap
from .launch import Server, free_port, tempdir

CONFIG = {config!r}


class RunningDummy(Running):
    def config_arg(self):
        return CONFIG

    def parse(self):
        return directives(self.lines, ("max_clients", "cache_dir"))

    def stats(self):
        return {{"available": True, "source": "the dummy's own count", "clients": 10}}


class Dummy(Spec, process=RunningDummy):
    kind, exe_names, order = "dummy", ("dummyproxyd",), 60
    unit, user, package = "dummy", "nobody", "dummy-proxy"
    host_configs = ("/etc/dummy/*.conf",)
    stores = {stores!r}
    store_design = {{s: "objects in memory" for s in stores}}

    @staticmethod
    def cache_dirs_in(lines):
        return [w[1] for ln in lines if len(w := ln.text.split()) > 1 and w[0] == "cache_dir"]

    @staticmethod
    def launch(store, plan, origin_port, nofile, device=None):
        return DummyServer()

    @staticmethod
    def caps(ev):
        p = ev["proxy"]
        d, n = p["directives"], int(p["directives"]["max_clients"]["value"])
        return [Cap("dummy-max-clients", "dummy", "max_clients", f"max_clients {{n}}", n,
                    where(d, "max_clients", p.get("config")), peak(p, "clients"), "its own count of clients", n,
                    "it stops accepting", "the dummy's manual", f"raise max_clients {{n}}")]

    @staticmethod
    def fd_fix(p):
        return "dummy: raise its fd limit in its unit"


class DummyServer(Server):
    """A stand-in started here: Python's http.server on a loopback port."""

    def __init__(self):
        self.dir, self.port = tempdir("dummy"), free_port()

    def __enter__(self):
        self._launch([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(self.dir),
                      str(self.port)])
        return self
'''

PROFILE = '''[profile]
description = "linux/proxy for the dummy proxy of the registry's test"
os = "linux"
include = ["linux/proxy"]

[params]
service = "dummy"
user = "nobody"
'''

# Run inside the copy: every answer the rest of the tool gives about the dummy, as JSON.
PROBE = r'''
import json, sys, importlib.machinery, importlib.util
root = sys.argv[1]
spec = importlib.machinery.ModuleSpec("proxytune", None, is_package=True)
spec.submodule_search_locations = [root]
sys.modules["proxytune"] = importlib.util.module_from_spec(spec)
from proxytune import proxies
from proxytune.probes import findings, proxies as doctor_door, proxies_findings
from proxytune.microbench import proxyruns, storequestion
from proxytune.tune import params
from proxytune.tune.host import Host
from pathlib import Path

out = {"names": proxies.names()}
target = doctor_door.identify(int(sys.argv[2]))
out["identified"] = [type(target).__name__, target.kind, target.profile(), target.describe()["directives"]]
out["audit_as"] = doctor_door.audit_as(target, "linux/proxy", "dummyproxyd")
ev = {"proxy": {**target.describe(), "stats_before": target.stats(), "stats_after": target.stats()},
      "procs": {}, "listeners": [], "netstat": {"ListenOverflows": 3}, "conns": {}}
generic = [findings.Finding("fd-exhaustion", "high", "t", {}, "generic fix")]
out["findings"] = [(f.id, f.fix) for f in proxies_findings.refine(generic, ev)]
out["tune"] = [params.KNOWN_PROXIES, params.DEFAULT_USERS["dummyproxyd"],
               params.detect_cache_dirs(Host(root=Path(sys.argv[3])), "dummyproxyd")]
out["storage_question"] = sorted(k for k in storequestion.DESIGN if k[0] == "dummy")
from proxytune.reports import summary
out["epoll_fix"] = summary.epoll_fix()
out["runs"] = proxyruns.runs_for(["dummy"], None)
if out["runs"]:
    import urllib.request
    with proxyruns.start("dummy", "mem", {"cache_mb": 8, "mem_mb": 0}, 1, None) as s:
        with urllib.request.urlopen(f"http://127.0.0.1:{s.port}/", timeout=10) as r:
            out["launched"] = [type(s).__name__, r.status, proxyruns.counters("dummy", s),
                               proxyruns.hit_ratio_from("dummy")]
print(json.dumps(out))
'''


def copy_with(tmp: Path, module: str) -> Path:
    """A copy of the checkout with the dummy's module and profile added: nothing else is new."""
    tree = tmp / "checkout"
    shutil.copytree(REPO, tree, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "build", "tests", "docs", "dist", "proxytune-*"))
    (tree / "proxies/dummy.py").write_text(module)
    (tree / "profiles/linux/dummy.toml").write_text(PROFILE)
    return tree


@pytest.fixture
def dummy_process(tmp_path):
    """A process whose executable is named dummyproxyd (a copy of sleep), and its config file."""
    conf = tmp_path / "dummy.conf"
    conf.write_text("max_clients 10\ncache_dir /var/cache/dummy\n")
    exe = tmp_path / "dummyproxyd"
    shutil.copy("/bin/sleep", exe)
    p = subprocess.Popen([str(exe), "600"])
    time.sleep(0.1)
    try:
        yield p, conf
    finally:
        p.kill()
        p.wait()


def test_a_sixth_proxy_is_one_module_and_one_profile(tmp_path, dummy_process):
    p, conf = dummy_process
    tree = copy_with(tmp_path, DUMMY.format(config=str(conf), stores=("mem",)))
    host = tmp_path / "host"
    (host / "etc/dummy").mkdir(parents=True)
    (host / "etc/dummy/a.conf").write_text("cache_dir /srv/dummy-cache\n")
    r = subprocess.run([sys.executable, "-c", PROBE, str(tree), str(p.pid), str(host)], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["names"] == proxies.names() + ["dummy"]                       # the registry found it, last
    kind, name, profile, directives = out["identified"]
    assert (kind, name, profile) == ("RunningDummy", "dummy", "linux/dummy")
    assert directives["max_clients"]["value"] == "10" and directives["max_clients"]["file"] == str(conf)
    assert out["audit_as"] == ["linux/dummy", "dummy"]                         # its own profile, its unit
    ids = [f[0] for f in out["findings"]]
    assert ids == ["dummy-max-clients", "fd-exhaustion"], out["findings"]       # its cap first, then its fix
    assert out["findings"][1][1] == "dummy: raise its fd limit in its unit"
    known, user, (dirs, source) = out["tune"]
    assert known[-1] == "dummyproxyd" and user == "nobody"
    assert dirs == ["/srv/dummy-cache"] and source == "/etc/dummy/a.conf"
    assert out["storage_question"] == [["dummy", "mem"]]
    assert out["epoll_fix"].endswith("trafficserver, dummy use it already")          # the report's advice
    assert out["runs"] == [["dummy", "mem"]]
    assert out["launched"] == ["DummyServer", 200, None, None]                  # no counters: X-Cache is used

    cli = [sys.executable, str(tree / "cli.py")]
    helped = subprocess.run([*cli, "bench", "proxy", "--help"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "COLUMNS": "400"})
    choices = re.search(r"--proxy \[([^\]]*)\]", helped.stdout)
    assert choices and choices.group(1).split("|")[-2:] == ["dummy", "all"], helped.stdout
    assert "dummy mem" in helped.stdout
    packages = subprocess.run([sys.executable, str(tree / "packaging/proxy-packages.py"), "dummy", "nginx"],
                              capture_output=True, text=True, timeout=60)
    assert packages.stdout.split() == ["nginx-light", "dummy-proxy"]


def test_a_proxy_without_stores_is_refused_by_bench_proxy_not_benched_as_nothing(tmp_path, dummy_process):
    tree = copy_with(tmp_path, DUMMY.format(config=str(dummy_process[1]), stores=()))
    r = subprocess.run([sys.executable, str(tree / "cli.py"), "bench", "proxy", "--proxy", "dummy", "--quick"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "dummy has no store to bench" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("proxytune:")]) == 1, r.stderr


def test_runs_for_refuses_a_proxy_without_stores_and_all_leaves_it_out(monkeypatch):
    monkeypatch.setattr(proxyruns, "PROXIES", proxyruns.PROXIES + ("bare",))
    monkeypatch.setitem(proxyruns.STORES, "bare", [])
    with pytest.raises(ProxytuneError, match="bare has no store to bench"):
        proxyruns.runs_for(["bare"], None)
    assert "bare" not in {p for p, _ in proxyruns.runs_for(["all"], None)}


def test_a_module_missing_a_piece_fails_at_import_naming_it():
    class Half(base.Spec):
        kind, exe_names, unit, user = "half", ("half",), "half", "half"
        stores = ("disk",)
        hit_ratio_from = "its log"
    with pytest.raises(ImportError) as e:
        proxies.check(Half)
    for piece in ("package", "process", "launch", "counters and hit_ratio_from"):
        assert piece in str(e.value), e.value


def test_every_registered_proxy_has_its_profile_and_its_pieces():
    for spec in proxies.KINDS:
        assert proxies.check(spec) is spec
        assert (REPO / "profiles" / f"{spec.profile()}.toml").is_file(), spec.kind
        assert spec.process.spec is spec and issubclass(spec.process, base.Running)
        assert proxies.for_service(spec.unit) is spec and all(proxies.for_service(e) is spec for e in spec.exe_names)
    assert [s.order for s in proxies.KINDS] == sorted(s.order for s in proxies.KINDS)

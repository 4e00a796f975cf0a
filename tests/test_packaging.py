"""make dist: the wheel installs into a fresh venv and the .deb unpacks into a
temp root, and both run from outside the checkout under one `proxytune`
namespace, finding their profiles, bpftrace scripts and C sources where they
were installed. Also: lintian finds no error, the man page and the bash
completion work, data is found in each layout, and builds go to a private cache.

Light core: without matplotlib and numpy every module imports, the core commands
run, and the report leaves its figures out saying so in one line. make deb-src:
dpkg-buildpackage builds the same files as make dist; the maintainer scripts run
against a temp root (DPKG_ROOT); the systemd units pass systemd-analyze verify.
Nothing is installed on the host."""

import gzip
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO
from proxytune.reports import measurements

DEBIAN_PYTHON = Path("/usr/bin/python3")
TOP_LEVEL = {"core", "proxies", "tune", "probes", "microbench", "reports", "commands", "cli", "cli.py", "profiles"}


def run(argv, cwd, env=None, timeout=300):
    r = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    return r


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    r = run([REPO / "packaging/dist.sh", out], cwd=REPO, env={"PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr
    wheel, = out.glob("proxytune-*-py3-none-any.whl")
    deb, = out.glob("proxytune_*_all.deb")
    return wheel, deb


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A working directory away from the checkout, a private build cache, and
    an apt-get on PATH that records any call (an installed copy makes none)."""
    home = tmp_path_factory.mktemp("outside")
    (home / "bin").mkdir()
    (home / "bin/apt-get").write_text(f"#!/bin/sh\necho \"$@\" >> {home}/apt-calls\n")
    (home / "bin/apt-get").chmod(0o755)
    env = {"PATH": f"{home}/bin:{os.environ['PATH']}", "PROXYTUNE_CACHE_DIR": str(home / "cache"),
           "XDG_CONFIG_HOME": str(home / "config"), "PYTHONDONTWRITEBYTECODE": "1"}
    for k in ("PROXYTUNE_ROOT", "PROXYTUNE_STATE_DIR", "PYTHONPATH"):
        env[k] = ""
    return home, env


def top_level(names) -> set[str]:
    return {n.split("/")[0] for n in names}


def test_the_wheel_holds_one_namespace_and_its_data(dist):
    wheel, _ = dist
    names = zipfile.ZipFile(wheel).namelist()
    assert top_level(names) == {"proxytune", wheel.name.split("-py3")[0] + ".dist-info"}
    for data in ("proxytune/profiles/linux/proxy.toml", "proxytune/probes/pollscan.bt",
                 "proxytune/microbench/evbench/main.c", "proxytune/microbench/objbench/objbench.h",
                 "proxytune/microbench/lua/polymix.lua", "proxytune/cli.py", "proxytune/commands/tune.py", "proxytune/tune/backends/sysctl.py",
                 "proxytune/core/procfs.py", "proxytune/reports/schemas/result.json"):
        assert data in names, data
    for harness in measurements.harnesses():     # every measurement's C sources, as its spec names them
        sources = {p.name for p in (REPO / "microbench" / harness.directory).iterdir() if p.suffix in (".c", ".h")}
        assert sources and all(f"proxytune/microbench/{harness.directory}/{s}" in names for s in sources), harness
    entry = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-py3')[0]}.dist-info/entry_points.txt").decode()
    assert "proxytune = proxytune.cli:run" in entry


def needs_debian_python():
    if not DEBIAN_PYTHON.exists():
        pytest.skip("needs Debian's python3")
    probe = run([DEBIAN_PYTHON, "-c", "import click, rich, jsonschema"], cwd="/")
    if probe.returncode:
        pytest.skip("needs python3-click python3-rich python3-jsonschema (make deps)")


@pytest.fixture(scope="module")
def wheel_venv(dist, tmp_path_factory):
    """The wheel in a fresh venv; its dependencies come from Debian's python3-* (no download)."""
    needs_debian_python()
    venv = tmp_path_factory.mktemp("venv") / "v"
    assert run([DEBIAN_PYTHON, "-m", "venv", "--system-site-packages", venv], cwd="/").returncode == 0
    r = run([venv / "bin/python", "-m", "pip", "install", "-q", "--no-index", "--disable-pip-version-check",
             dist[0]], cwd="/")
    assert r.returncode == 0, r.stderr
    return venv


def test_wheel_runs_from_outside_the_checkout(wheel_venv, outside):
    home, env = outside
    site, = (wheel_venv / "lib").glob("python3*/site-packages")
    assert not TOP_LEVEL & {p.name for p in site.iterdir()}, sorted(p.name for p in site.iterdir())
    installed = sorted(site.joinpath("proxytune").rglob("*"))
    exe = wheel_venv / "bin/proxytune"
    r = run([exe, "--version"], cwd=home, env=env)
    assert r.returncode == 0 and "0.1.0" in r.stdout, r.stderr
    r = run([exe, "tune", "check", "--json", "--service", "nosuchproxy"], cwd=home, env=env)
    assert r.returncode in (0, 1), r.stderr
    assert json.loads(r.stdout)["kind"] == "audit"
    r = run([exe, "profiles", "list"], cwd=home, env=env)
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert ["linux/proxy", "shipped", "linux"] == rows[[row[0] for row in rows].index("linux/proxy")][:3]
    r = run([exe, "bench", "events", "--quick", "-o", home / "events.json"], cwd=home, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads((home / "events.json").read_text())["data"]["idle"]
    assert list((home / "cache").glob("evbench-*")), "the harness is built in the private cache"
    assert sorted(site.joinpath("proxytune").rglob("*")) == installed, "nothing is written next to installed code"
    assert not (home / "apt-calls").exists(), "an installed proxytune never installs anything"


@pytest.fixture(scope="module")
def deb_root(dist, tmp_path_factory):
    needs_debian_python()
    root = tmp_path_factory.mktemp("debroot")
    assert run(["dpkg-deb", "-x", dist[1], root], cwd="/").returncode == 0
    return root


def deb_env(root, env):
    return {**env, "PYTHONPATH": str(root / "usr/lib/python3/dist-packages")}


def test_deb_layout_follows_debian(deb_root, dist):
    files = {str(p.relative_to(deb_root)) for p in deb_root.rglob("*") if p.is_file()}
    assert "usr/bin/proxytune" in files and os.access(deb_root / "usr/bin/proxytune", os.X_OK)
    assert {"usr/share/proxytune/profiles/linux/proxy.toml", "usr/share/proxytune/probes/pollscan.bt",
            "usr/share/proxytune/microbench/evbench/main.c", "usr/share/man/man8/proxytune.8.gz",
            "usr/share/bash-completion/completions/proxytune", "usr/share/doc/proxytune/copyright",
            "usr/share/doc/proxytune/changelog.Debian.gz"} <= files
    assert top_level(f[len("usr/lib/python3/dist-packages/"):] for f in files
                     if f.startswith("usr/lib/python3/dist-packages/")) == {"proxytune"}
    for harness in measurements.harnesses():     # every measurement's C sources, in the shared data
        sources = {p.name for p in (REPO / "microbench" / harness.directory).iterdir() if p.suffix in (".c", ".h")}
        assert {f"usr/share/proxytune/microbench/{harness.directory}/{s}" for s in sources} <= files, harness
    assert not [f for f in files if f.startswith("usr/lib/python3/dist-packages/proxytune/profiles")]
    control = run(["dpkg-deb", "-f", dist[1], "Depends", "Recommends", "Suggests"], cwd="/").stdout
    depends, recommends = control.split("\n")[:2]
    for dep in ("python3 (>= 3.11)", "python3-click", "python3-rich", "python3-jsonschema"):
        assert dep in depends, control
    assert "matplotlib" not in depends and "numpy" not in depends, depends
    assert "python3-matplotlib" in recommends, recommends
    for optional in ("bpftrace", "linux-perf", "fio", "wrk", "gcc", "liburing-dev", "valgrind"):
        assert optional in control
    page = gzip.decompress((deb_root / "usr/share/man/man8/proxytune.8.gz").read_bytes()).decode()
    assert page.startswith(".TH PROXYTUNE 8") and "tune check" in page and "\\-\\-profile" in page


def test_deb_runs_from_its_unpacked_root(deb_root, outside):
    home, env = outside
    env = deb_env(deb_root, env)
    exe = [DEBIAN_PYTHON, deb_root / "usr/bin/proxytune"]
    r = run([*exe, "--version"], cwd=home, env=env)
    assert r.returncode == 0 and "0.1.0" in r.stdout, r.stderr
    r = run([*exe, "profiles", "list", "--json"], cwd=home, env=env)
    rows = {row["name"]: row for row in json.loads(r.stdout)["data"]["profiles"]}
    assert rows["linux/proxy"]["path"].startswith(str(deb_root / "usr/share/proxytune/profiles"))
    r = run([*exe, "tune", "check", "--json", "--service", "nosuchproxy"], cwd=home, env=env)
    assert r.returncode in (0, 1) and json.loads(r.stdout)["kind"] == "audit", r.stderr
    r = run([*exe, "probe", "list", "--json"], cwd=home, env=env)
    assert {p["name"] for p in json.loads(r.stdout)["data"]["scripts"]} >= {"pollscan", "syscall_mix"}
    r = run([*exe, "schema", "audit"], cwd=home, env=env)
    assert json.loads(r.stdout)["properties"]["kind"]["const"] == "audit", r.stderr
    r = run([*exe, "bench", "fdscan", "--quick", "-o", home / "fdscan.json"], cwd=home, env=env)
    assert r.returncode == 0, r.stderr
    assert not (home / "apt-calls").exists()


def test_deb_bash_completion_completes_commands_profiles_and_probes(deb_root, outside):
    if not shutil.which("bash"):
        pytest.skip("needs bash")
    home, env = outside
    wrapper = home / "bin/proxytune"
    wrapper.write_text(f"#!/bin/sh\nexec {DEBIAN_PYTHON} {deb_root}/usr/bin/proxytune \"$@\"\n")
    wrapper.chmod(0o755)

    def complete(*words):
        script = (f"source {deb_root}/usr/share/bash-completion/completions/proxytune\n"
                  f"COMP_WORDS=(proxytune {' '.join(words)}); COMP_CWORD={len(words)}\n"
                  "_proxytune_completion proxytune; printf '%s\\n' \"${COMPREPLY[@]}\"")
        r = run(["bash", "-c", script], cwd=home, env=deb_env(deb_root, env))
        return set(r.stdout.split())
    assert "tune" in complete("t")
    assert complete("tune", "check", "--profile", "linux/squ") == {"linux/squid", "linux/squid-2000"}
    assert complete("probe", "run", "pollsc") == {"pollscan"}


def lintian_complaints(deb) -> list[str]:
    """lintian's errors and warnings (what it overrides, with the reason in the override file, aside)."""
    if not shutil.which("lintian"):
        pytest.skip("needs lintian (make deps)")
    r = run(["lintian", "--tag-display-limit", "0", deb], cwd="/", timeout=300)
    return [line for line in r.stdout.splitlines() if line[:2] in ("E:", "W:")]


def test_lintian_finds_no_error_or_warning(dist):
    assert not lintian_complaints(dist[1])


def test_imports_use_the_one_namespace():
    """After a merge, packaging/rewrite-imports.py has to be run again: this fails until it is."""
    r = run([sys.executable, REPO / "packaging/rewrite-imports.py", "--check"], cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr


def test_shipped_data_is_found_in_the_debian_share_dir(tmp_path, monkeypatch):
    from proxytune.tune import datafiles
    package = tmp_path / "usr/lib/python3/dist-packages/proxytune"
    (package / "probes").mkdir(parents=True)
    (tmp_path / "usr/share/proxytune/profiles").mkdir(parents=True)
    monkeypatch.setattr(datafiles, "PACKAGE_ROOT", package)
    assert datafiles.shipped("probes") == tmp_path / "usr/share/proxytune/probes"
    (package / "profiles").mkdir()
    assert datafiles.shipped("probes") == package / "probes"


def test_the_build_cache_is_private(tmp_path, monkeypatch):
    from proxytune.tune import datafiles
    from proxytune.core.errors import ProxytuneError
    monkeypatch.setenv("PROXYTUNE_CACHE_DIR", str(tmp_path / "cache"))
    made = datafiles.cache_dir()
    assert made.stat().st_mode & 0o777 == 0o700
    made.chmod(0o777)
    with pytest.raises(ProxytuneError, match="writable by others"):
        datafiles.cache_dir()
    # a symlinked cache is vetted where it points: test_adversarial_writes.py
    monkeypatch.delenv("PROXYTUNE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)       # a user's cache: under XDG_CACHE_HOME, not /var/cache
    monkeypatch.setattr(datafiles.files, "private_dir", lambda p: p)
    assert datafiles.cache_dir() == (tmp_path / "xdg/proxytune").resolve()


# -- light core: plotting is optional ---------------------------------------------------------

PLOTS_HINT = ("plots left out: matplotlib is not installed "
              "(apt install python3-matplotlib, or pipx inject proxytune matplotlib)")


def without_plotting(tmp_path) -> dict:
    """An environment where `import matplotlib` and `import numpy` fail, as on a host without them."""
    block = tmp_path / "no-plotting"
    for name in ("matplotlib", "numpy"):
        (block / name).mkdir(parents=True, exist_ok=True)
        (block / name / "__init__.py").write_text(f"raise ImportError('no module named {name} (test)')\n")
    return {"PYTHONPATH": str(block)}


def saved_fdscan(tmp_path) -> Path:
    """A saved `bench fdscan` result, the shape the report draws a figure from."""
    stats = {"median": 100.0, "min": 90.0, "max": 110.0, "n": 5, "iqr_rel": 0.1, "ci95": [90.0, 110.0]}
    doc = {"schema": "proxytune.result/1", "kind": "bench", "created": "2026-11-23T12:00:00Z",
           "host": {"hostname": "h", "os": "Debian", "kernel": "6", "arch": "x86_64", "cpu_model": "c",
                    "cores": 2, "memory_kib": 1, "virtualised": "no", "filesystems": []},
           "data": {"bench": "fdscan", "quick": True, "variants": {str(v): f"variant {v}" for v in range(1, 6)},
                    "points": [{"variant": v, "n": n, "handlers_per_call": 9.0, "command": "x",
                                "ns_per_call": {**stats, "median": 100.0 * v * n}}
                               for v in range(1, 6) for n in (100, 1000)],
                    "misses": [], "miss_source": "unavailable", "miss_source_note": "none here"}}
    path = tmp_path / "fdscan.json"
    path.write_text(json.dumps(doc))
    return path


def test_every_module_imports_without_matplotlib_or_numpy(tmp_path):
    """Importing any module of the package needs no plotting library (a lazy import everywhere);
    modules that need something else (the Ansible callback needs ansible) are not this test's business."""
    script = ("import importlib, importlib.machinery, importlib.util, pathlib, sys\n"
              f"sys.path.insert(0, {str(REPO)!r})\n"
              "spec = importlib.machinery.ModuleSpec('proxytune', None, is_package=True)\n"
              "spec.submodule_search_locations = [sys.path[0]]\n"
              "sys.modules['proxytune'] = importlib.util.module_from_spec(spec)\n"
              "bad = []\n"
              f"for f in sorted(pathlib.Path({str(REPO)!r}).glob('*/**/*.py')):\n"
              "    rel = f.relative_to(sys.path[0])\n"
              "    if rel.parts[0] not in ('core', 'proxies', 'tune', 'probes', 'microbench', 'reports', 'commands'): continue\n"
              "    name = 'proxytune.' + '.'.join(rel.with_suffix('').parts).removesuffix('.__init__')\n"
              "    try: importlib.import_module(name)\n"
              "    except ImportError as e: bad += [f'{name}: {e}'] if '(test)' in str(e) else []\n"
              "importlib.import_module('proxytune.cli')\n"
              "print('\\n'.join(bad)); sys.exit(1 if bad else 0)\n")
    env = without_plotting(tmp_path)
    assert run([sys.executable, "-c", "import matplotlib"], cwd=tmp_path, env=env).returncode != 0
    r = run([sys.executable, "-c", script], cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_without_matplotlib_the_report_leaves_plots_out_and_says_how_in_one_line(tmp_path):
    saved = saved_fdscan(tmp_path)
    argv = [sys.executable, REPO / "cli.py", "report", "--no-bench", "--from", saved, "-o"]
    r = run([*argv, tmp_path / "plain"], cwd=tmp_path, env=without_plotting(tmp_path))
    assert r.returncode in (0, 1), r.stderr
    assert [line for line in r.stderr.splitlines() if "plots" in line] == [f"proxytune: {PLOTS_HINT}"]
    out = tmp_path / "plain"
    assert not list(out.glob("*.png"))
    assert "data:image/png" not in (out / "report.html").read_text()
    assert json.loads((out / "report.json").read_text())["data"]["skipped"]["plots"] == PLOTS_HINT
    assert "fdscan" in json.loads((out / "report.json").read_text())["data"]["sections"]
    r = run([*argv, tmp_path / "drawn"], cwd=tmp_path)          # the same with matplotlib: the figure is there
    assert r.returncode in (0, 1) and "plots left out" not in r.stderr, r.stderr
    assert (tmp_path / "drawn/fdscan.png").read_bytes()[:4] == b"\x89PNG"


def test_the_core_commands_run_without_matplotlib(tmp_path):
    env = {**without_plotting(tmp_path), "PROXYTUNE_STATE_DIR": str(tmp_path / "state")}
    cli = [sys.executable, REPO / "cli.py"]
    r = run([*cli, "tune", "check", "--json", "--service", "nosuchproxy"], cwd=tmp_path, env=env)
    assert r.returncode in (0, 1) and json.loads(r.stdout)["kind"] == "audit", r.stderr
    r = run([*cli, "bench", "fdscan", "--quick", "--json"], cwd=tmp_path, env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["data"]["bench"] == "fdscan", r.stderr


def test_the_wheel_needs_matplotlib_only_for_its_report_extra(dist):
    wheel, _ = dist
    meta = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-py3')[0]}.dist-info/METADATA").decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    plotting = [r for r in requires if r.lower().startswith(("matplotlib", "numpy"))]
    assert plotting and all('extra == "report"' in r for r in plotting), requires
    assert "Provides-Extra: report" in meta
    core = [r.split(">")[0].split(";")[0].strip() for r in requires if "extra ==" not in r]
    assert sorted(core) == ["click", "jsonschema", "rich"]


# -- the source package, the package lifecycle, the systemd units -------------------------------

@pytest.fixture(scope="module")
def source_deb(tmp_path_factory):
    """The .deb that `make deb-src` builds: dpkg-buildpackage -us -uc -b, dh + pybuild."""
    if not shutil.which("dpkg-buildpackage"):
        pytest.skip("needs dpkg-dev")
    missing = run(["dpkg-checkbuilddeps", REPO / "packaging/debian/control"], cwd="/")
    if missing.returncode:
        pytest.skip(f"needs the Build-Depends (make deps): {missing.stderr.strip()}")
    out = tmp_path_factory.mktemp("deb-src")
    r = run([REPO / "packaging/build-src.sh", out], cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr
    deb, = out.glob("proxytune_*_all.deb")
    assert list(out.glob("proxytune_*.changes")) and list(out.glob("proxytune_*.buildinfo"))
    return deb


def deb_files(deb) -> set[str]:
    """The .deb's regular files, without the dist-info only the dh build keeps."""
    listing = run(["dpkg-deb", "-c", deb], cwd="/").stdout.splitlines()
    names = {line.split()[5].removeprefix(".") for line in listing if line.startswith("-")}
    return {n for n in names if ".dist-info/" not in n}


def control_file(deb, name) -> str:
    r = run(["dpkg-deb", "--info", deb, name], cwd="/")
    return r.stdout if r.returncode == 0 else ""


def test_the_source_package_builds_the_same_package_as_make_dist(source_deb, dist):
    made = deb_files(dist[1])
    assert deb_files(source_deb) == made
    assert {"/etc/proxytune/profiles/README", "/lib/systemd/system/proxytune.service",
            "/lib/systemd/system/proxytune-watch.service",
            "/lib/systemd/system/proxytune.timer", "/usr/share/man/man5/proxytune-profile.5.gz",
            "/usr/share/zsh/vendor-completions/_proxytune", "/usr/share/fish/vendor_completions.d/proxytune.fish",
            "/usr/share/lintian/overrides/proxytune"} <= made
    for deb in (source_deb, dist[1]):
        assert control_file(deb, "conffiles").split() == ["/etc/proxytune/profiles/README"]
        fields = run(["dpkg-deb", "-f", deb, "Depends", "Recommends"], cwd="/").stdout
        assert "python3-click" in fields and "matplotlib" not in fields.split("\n")[0]
        for script in ("postinst", "prerm", "postrm"):
            assert "#DEBHELPER#" not in control_file(deb, script), (deb, script)
        assert "/var/lib/proxytune" in control_file(deb, "postrm")
        assert "open_entries" in control_file(deb, "prerm")
        postinst = control_file(deb, "postinst")      # ships disabled: enabled again only if the admin had
        assert "deb-systemd-invoke" not in postinst
        assert "helper enable" not in postinst or "was-enabled" in postinst.split("helper enable")[0]


def test_lintian_passes_the_source_built_package(source_deb):
    assert not lintian_complaints(source_deb)


def maintainer_script(deb_root, dist, name, tmp_path) -> Path:
    path = tmp_path / name
    path.write_text(control_file(dist[1], name))
    path.chmod(0o755)
    return path


def test_postrm_removes_the_cache_on_remove_and_the_journal_on_purge_and_says_so(deb_root, dist, tmp_path):
    root = tmp_path / "root"
    for d in ("var/cache/proxytune/evbench-1", "var/lib/proxytune/journal", "var/lib/other"):
        (root / d).mkdir(parents=True)
    postrm = maintainer_script(deb_root, dist, "postrm", tmp_path)
    r = run([postrm, "remove"], cwd=tmp_path, env={"DPKG_ROOT": str(root)})
    assert r.returncode == 0, r.stderr
    assert not (root / "var/cache/proxytune").exists() and (root / "var/lib/proxytune/journal").is_dir()
    assert "removed /var/cache/proxytune" in r.stdout
    r = run([postrm, "purge"], cwd=tmp_path, env={"DPKG_ROOT": str(root)})
    assert r.returncode == 0, r.stderr
    assert not (root / "var/lib/proxytune").exists() and (root / "var/lib/other").is_dir()
    assert "purged /var/lib/proxytune" in r.stdout
    r = run([postrm, "purge"], cwd=tmp_path, env={"DPKG_ROOT": str(root)})
    assert r.returncode == 0 and "proxytune" not in r.stdout, "nothing left: nothing said"


def test_prerm_warns_about_open_applies_and_never_fails_the_removal(deb_root, dist, tmp_path):
    """The journal is written by the code that apply uses; the prerm reads it with the
    package's own journal module (DPKG_ROOT: the unpacked package, standing in for /)."""
    from proxytune.tune import journal
    prerm = maintainer_script(deb_root, dist, "prerm", tmp_path)
    (tmp_path / "bin").mkdir()                         # dh's part: py3clean asks dpkg about the installed package
    (tmp_path / "bin/py3clean").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "bin/py3clean").chmod(0o755)
    env = {"DPKG_ROOT": str(deb_root), "PATH": f"{tmp_path}/bin:{DEBIAN_PYTHON.parent}:{os.environ['PATH']}"}
    state = deb_root / "var/lib/proxytune"
    try:
        r = run([prerm, "remove"], cwd=tmp_path, env=env)
        assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
        entry = journal.new_entry(state, "linux/proxy", "linux", Path("/"), [])
        journal.save(state, entry)
        r = run([prerm, "remove"], cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        assert "still open" in r.stderr and entry["id"] in r.stderr and "linux/proxy" in r.stderr
        assert "tune rollback" in r.stderr
        (state / "journal" / f"{entry['id']}.json").write_text("{not json")
        r = run([prerm, "remove"], cwd=tmp_path, env=env)
        assert r.returncode == 0 and "could not read the apply journal" in r.stderr, r.stderr
        r = run([prerm, "upgrade", "0.1.0-1"], cwd=tmp_path, env=env)
        assert r.returncode == 0 and "warning" not in r.stderr, "an upgrade keeps the journal: no warning"
        bare = tmp_path / "bare"                      # a root without proxytune's modules: python3 fails
        (bare / "var/lib/proxytune/journal").mkdir(parents=True)
        r = run([prerm, "remove"], cwd=tmp_path, env={**env, "DPKG_ROOT": str(bare)})
        assert r.returncode == 0 and "could not read the apply journal (ModuleNotFoundError" in r.stderr, r.stderr
    finally:
        shutil.rmtree(deb_root / "var", ignore_errors=True)


def verify_units(root: Path, *units: str) -> subprocess.CompletedProcess:
    return run(["systemd-analyze", "verify", "--man=no", f"--root={root}",
                *(f"/lib/systemd/system/{u}" for u in units)], cwd="/")


def test_the_systemd_units_verify_and_ship_disabled(dist, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("needs systemd (make deps)")
    root = tmp_path / "root"
    assert run(["dpkg-deb", "-x", dist[1], root], cwd="/").returncode == 0
    units = root / "lib/systemd/system"
    for unit in Path("/lib/systemd/system").iterdir():       # the targets the timer hangs on
        if unit.is_file() and not (units / unit.name).exists():
            shutil.copy(unit, units / unit.name)
    r = verify_units(root, "proxytune.timer", "proxytune.service", "proxytune-watch.service")
    assert r.returncode == 0 and not r.stdout + r.stderr, r.stdout + r.stderr
    watcher = (units / "proxytune-watch.service").read_text()
    assert "ExecStart=/usr/bin/proxytune watch\n" in watcher and "SuccessExitStatus=130" in watcher
    assert "ReadWritePaths=/var/lib/proxytune\n" in watcher and "WantedBy=multi-user.target" in watcher
    service = (units / "proxytune.service").read_text()
    assert ("ExecStart=/usr/bin/proxytune tune check --format prometheus "
            "-o /var/lib/prometheus/node-exporter/proxytune.prom") in service
    assert "[Install]" not in service and "WantedBy=timers.target" in (units / "proxytune.timer").read_text()
    assert not list(root.glob("etc/systemd/system/*.wants")), "nothing enabled by the package"
    (units / "proxytune.service").write_text(service.replace("/usr/bin/proxytune", "/usr/bin/proxytune-gone"))
    r = verify_units(root, "proxytune.service")
    assert r.returncode != 0 and "proxytune-gone" in r.stderr, "the check would see a broken unit"


# -- teaching: man pages and completion for every install ---------------------------------------

def test_the_man_page_has_examples_files_and_see_also(deb_root):
    page = gzip.decompress((deb_root / "usr/share/man/man8/proxytune.8.gz").read_bytes()).decode()
    sections = {line.split(None, 1)[1].strip('"') for line in page.splitlines() if line.startswith(".SH ")}
    assert {"EXAMPLES", "FILES", "SEE ALSO", "EXIT STATUS", "ENVIRONMENT", "COMMANDS"} <= sections
    see_also = page.split(".SH SEE ALSO\n", 1)[1]
    for ref in ("tuned\\-adm(8)", "sysctl.d(5)", "systemd.exec(5)", "limits.conf(5)", "proxytune\\-profile(5)"):
        assert ref in see_also, ref
    files = page.split(".SH FILES\n", 1)[1].split(".SH ")[0]
    for path in ("/etc/proxytune/profiles/", "/var/lib/proxytune/journal/", "proxytune.timer"):
        assert path in files, path
    assert "proxytune tune check" in page.split(".SH EXAMPLES\n", 1)[1]


def test_the_profile_page_names_every_mode_backend_and_profile_key(deb_root):
    from proxytune.tune import backends, profile
    page = gzip.decompress((deb_root / "usr/share/man/man5/proxytune-profile.5.gz").read_bytes()).decode()
    assert page.startswith(".TH PROXYTUNE\\-PROFILE 5")
    for word in [*profile.MODES, *profile.PROFILE_KEYS, *profile.SETTING_TEXT, *profile.PLACEHOLDERS,
                 *profile.OPTIONAL_TEXT, "critical", "shipped:"]:
        assert word.replace("-", "\\-") in page, word
    for os_name, kind in backends.REGISTRY:
        assert f"{kind} ({os_name})" in page
    if shutil.which("groff"):
        r = subprocess.run(["groff", "-man", "-ww", "-z"], input=page, capture_output=True, text=True)
        assert r.returncode == 0 and not r.stderr, r.stderr


def test_man_and_completion_for_a_pipx_install(wheel_venv, outside, tmp_path):
    home, env = outside
    exe = wheel_venv / "bin/proxytune"
    r = run([exe, "man"], cwd=home, env=env)
    assert r.returncode == 0 and r.stdout.startswith(".TH PROXYTUNE 8") and ".SH EXAMPLES" in r.stdout
    r = run([exe, "man", "proxytune-profile"], cwd=home, env=env)
    assert r.returncode == 0 and r.stdout.startswith(".TH PROXYTUNE\\-PROFILE 5")
    data = tmp_path / "data"
    r = run([exe, "man", "--install"], cwd=home, env={**env, "XDG_DATA_HOME": str(data)})
    assert r.returncode == 0, r.stderr
    assert (data / "man/man8/proxytune.8").read_text().startswith(".TH PROXYTUNE 8")
    assert (data / "man/man5/proxytune-profile.5").read_text().startswith(".TH PROXYTUNE\\-PROFILE 5")
    if shutil.which("man"):
        r = run(["man", "-M", data / "man", "proxytune-profile"], cwd=home, env={**env, "MANPAGER": "cat"})
        assert "at_least" in r.stdout, r.stderr
    for shell, marker in (("bash", "_proxytune_completion"), ("zsh", "#compdef proxytune"),
                          ("fish", "complete --no-files --command proxytune")):
        r = run([exe, "completion", shell], cwd=home, env=env)
        assert r.returncode == 0 and marker in r.stdout, (shell, r.stdout[:200])
    r = run([exe, "completion", "tcsh"], cwd=home, env=env)
    assert r.returncode == 2 and "tcsh" in r.stderr


def test_completion_from_the_command_completes_like_the_shipped_file(wheel_venv, outside):
    if not shutil.which("bash"):
        pytest.skip("needs bash")
    home, env = outside
    script = (f"source <({wheel_venv}/bin/proxytune completion bash)\n"
              "COMP_WORDS=(proxytune tune check --profile linux/squ); COMP_CWORD=4\n"
              "_proxytune_completion proxytune; printf '%s\\n' \"${COMPREPLY[@]}\"")
    r = run(["bash", "-c", script], cwd=home, env={**env, "PATH": f"{wheel_venv}/bin:{env['PATH']}"})
    assert set(r.stdout.split()) == {"linux/squid", "linux/squid-2000"}, r.stderr


def parse_command_line(args: list[str]) -> str:
    """Parse a proxytune command line as click would run it (nothing is run); a wrong
    option or command raises click.UsageError."""
    import warnings
    import click
    from proxytune.cli import main
    cmd, name, ctx, rest = main, "proxytune", None, list(args)
    while True:
        ctx = cmd.make_context(name, rest, parent=ctx)
        if not isinstance(cmd, click.Group):
            return ctx.command_path
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)     # protected_args, click >= 8.2
            rest = [*ctx.protected_args, *ctx.args]
        if not rest and cmd.invoke_without_command:                 # `proxytune report`
            return ctx.command_path
        name, cmd, rest = cmd.resolve_command(ctx, rest)


def test_every_example_in_the_man_page_is_a_valid_command():
    import re
    import shlex
    import click
    from proxytune.core.manpage import EXAMPLES
    lines = [re.search(r"proxytune [^|)\"]*", term.replace("\\-", "-"))[0] for term, _ in EXAMPLES
             if "proxytune " in term and not term.startswith("systemctl")]
    assert len(lines) >= 8
    for line in lines:
        assert parse_command_line(shlex.split(line)[1:]), line
    with pytest.raises(click.UsageError):                   # the check can fail
        parse_command_line(["doctor", "--service", "squid"])


def test_a_checkout_installs_the_report_extra(tmp_path):
    """./proxytune's first run pip-installs the core and the `report` extra (the checkout's
    report draws its figures); PROXYTUNE_EXTRAS=test adds the test extra. The venv python
    is a fake that records pip's arguments and hands the launcher's dependency listing
    to the real interpreter."""
    import tomllib
    top, bin_dir, log = tmp_path / "checkout", tmp_path / "bin", tmp_path / "pip.log"
    top.mkdir()
    bin_dir.mkdir()
    shutil.copy(REPO / "proxytune", top / "proxytune")
    shutil.copy(REPO / "pyproject.toml", top / "pyproject.toml")
    venv_python = (f'#!/bin/sh\ncase "$1" in -) exec {sys.executable} "$@" ;; '
                   f'-m) echo "$@" >> {log} ;; esac\n')
    # the system's python3, which the launcher runs isolated (-I: no user site under sudo -E, issue 27)
    fake_python = (f'#!/bin/sh\nif [ "$1" = -I ]; then shift; else echo "$@" >> {log}.not-isolated; fi\n'
                   f'if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin"; '
                   f"printf '%s' '{venv_python}' > \"$3/bin/python\"; chmod +x \"$3/bin/python\"; fi\n")
    (bin_dir / "python3.13").write_text(fake_python)
    (bin_dir / "python3.13").chmod(0o755)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PROXYTUNE_NO_INSTALL": "1"}
    for extras, wanted in (("", project["optional-dependencies"]["report"]),
                           ("test", project["optional-dependencies"]["report"] + project["optional-dependencies"]["test"])):
        log.unlink(missing_ok=True)
        shutil.rmtree(top / ".venv", ignore_errors=True)
        r = run([top / "proxytune", "--version"], cwd=tmp_path, env={**env, "PROXYTUNE_EXTRAS": extras})
        assert r.returncode == 0, r.stderr
        assert not Path(f"{log}.not-isolated").exists(), Path(f"{log}.not-isolated").read_text()
        pip = log.read_text().split()
        assert pip[:3] == ["-m", "pip", "install"], pip
        assert sorted(a for a in pip[3:] if not a.startswith("-")) == sorted(project["dependencies"] + wanted)

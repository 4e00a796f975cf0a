"""No surprise installs: the checkout launcher installs Debian packages only
for the commands that need them, says which, and PROXYTUNE_NO_INSTALL=1
turns it off. Run against a copy of the launcher in a temp checkout whose
apt-get, dpkg-query, id and python are fakes that record their calls."""

import os
import shutil
import stat
import subprocess

import pytest

from conftest import REPO

REPORT = "gcc libc6-dev liburing-dev valgrind linux-perf iproute2 fio wrk squid nginx-light".split()
BENCH = REPORT
FLEET = ["ansible-core", "openssh-client"]


def fake(path, body):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def checkout(tmp_path):
    """A checkout with the real launcher and pyproject, a fake venv python, fakes on PATH."""
    top, bin_dir, log = tmp_path / "checkout", tmp_path / "bin", tmp_path / "calls.log"
    (top / ".venv/bin").mkdir(parents=True)
    bin_dir.mkdir()
    shutil.copy(REPO / "proxytune", top / "proxytune")
    shutil.copy(REPO / "pyproject.toml", top / "pyproject.toml")
    for tree in ("core", "proxies"):            # the registry names each proxy's package
        shutil.copytree(REPO / tree, top / tree, ignore=shutil.ignore_patterns("__pycache__"))
    (top / "packaging").mkdir()
    shutil.copy(REPO / "packaging/proxy-packages.py", top / "packaging")
    fake(top / ".venv/bin/python", f'echo "python $*" >> {log}\n')
    for stamp in (".installed", ".installed-test"):
        (top / ".venv" / stamp).touch()
    fake(bin_dir / "apt-get", f'echo "apt-get $*" >> {log}\n')
    fake(bin_dir / "dpkg-query", 'echo "${FAKE_DPKG_STATUS:-deinstall ok config-files}"\n')   # default: all missing
    fake(bin_dir / "id", 'if [ "$1" = -u ]; then echo 0; else exec /usr/bin/id "$@"; fi\n')

    def run(*args, env=None):
        environment = {k: v for k, v in os.environ.items() if k not in ("PROXYTUNE_NO_INSTALL", "PROXYTUNE_EXTRAS")}
        environment.update({"PATH": f"{bin_dir}:{os.environ['PATH']}", "PROXYTUNE_STATE_DIR": str(tmp_path / "state"),
                            **(env or {})})
        r = subprocess.run([str(top / "proxytune"), *args], capture_output=True, text=True, env=environment,
                           timeout=60)
        calls = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return r, [c for c in calls if c.startswith("apt-get")], [c for c in calls if c.startswith("python")]
    return run


def installed(apt_calls):
    return [c.split()[5:] for c in apt_calls if " install " in c]


def test_tune_and_profiles_never_install(checkout):
    for args in (["tune", "check"], ["--root", "/srv/img", "tune", "apply", "--yes"], ["profiles", "list"],
                 ["--version"], []):
        r, apt, python = checkout(*args)
        assert r.returncode == 0, r.stderr
        assert apt == [], (args, apt)
        assert "Debian packages" not in r.stderr
        assert python and python[-1].endswith(" ".join(["cli.py", *args]))


def test_report_installs_exactly_its_packages_and_says_which(checkout):
    r, apt, python = checkout("report", "--no-bench")
    assert r.returncode == 0, r.stderr
    assert apt[0] == "apt-get update -q" and installed(apt) == [REPORT]
    assert f"report needs these Debian packages; installing: {' '.join(REPORT)}" in r.stderr
    assert python[-1].endswith("cli.py report --no-bench")


def test_the_command_is_found_after_global_options(checkout):
    _, apt, _ = checkout("--root", "/srv/img", "--state-dir=/tmp/x", "--format", "tsv", "bench", "events")
    assert installed(apt) == [BENCH]
    _, apt, _ = checkout("doctor", "--comm", "squid")
    assert installed(apt) == [["bpftrace", "linux-perf", "iproute2"]]
    _, apt, _ = checkout("probe", "list")
    assert installed(apt) == [["bpftrace", "linux-perf", "valgrind"]]


def test_fleet_installs_the_ansible_controller(checkout):
    """`fleet` from a fresh clone stopped at "ansible-playbook is not installed" while `report` installed its own."""
    r, apt, python = checkout("fleet", "check", "-i", "hosts.ini")
    assert installed(apt) == [FLEET]
    assert f"fleet needs these Debian packages; installing: {' '.join(FLEET)}" in r.stderr
    assert python[-1].endswith("cli.py fleet check -i hosts.ini")
    _, apt, _ = checkout("--state-dir", "/tmp/x", "fleet", "doctor", "-i", "hosts.ini")
    assert installed(apt) == [FLEET]
    _, apt, _ = checkout("report", "fleet", "result.json")      # reads a result: the report's own packages
    assert installed(apt) == [REPORT]


def test_installed_packages_are_not_installed_again(checkout):
    r, apt, python = checkout("fleet", "check", "-i", "hosts.ini",
                              env={"FAKE_DPKG_STATUS": "install ok installed"})
    assert apt == [] and "Debian packages" not in r.stderr
    assert python[-1].endswith("cli.py fleet check -i hosts.ini")


def test_help_never_installs(checkout):
    for args in (["bench", "--help"], ["report", "-h"], ["fleet", "check", "--help"]):
        _, apt, _ = checkout(*args)
        assert apt == [], args


def test_no_install_names_the_packages_and_installs_nothing(checkout):
    r, apt, python = checkout("report", env={"PROXYTUNE_NO_INSTALL": "1"})
    assert apt == [] and python
    assert f"report would use the Debian packages: {' '.join(REPORT)}" in r.stderr


def test_bench_proxy_installs_each_proxy_it_is_asked_to_start(checkout):
    """`bench proxy` stopped at "varnishd is not installed" while it installed fio itself."""
    _, apt, _ = checkout("bench", "proxy", "--proxy", "varnish", "--proxy=trafficserver", "--proxy", "nginx",
                         "--proxy", "squid")
    assert installed(apt) == [BENCH + ["varnish", "trafficserver"]]
    r, apt, _ = checkout("bench", "proxy", "--proxy", "haproxy", env={"PROXYTUNE_NO_INSTALL": "1"})
    assert apt == [] and "haproxy" in r.stderr.split("Debian packages:")[1]


def test_two_runs_at_once_install_in_turn(tmp_path):
    """The first run's policy-rc.d must not be removed while the second's apt-get still installs: the
    installs take turns under a lock in the state dir."""
    top, bin_dir, log = tmp_path / "checkout", tmp_path / "bin", tmp_path / "calls.log"
    (top / ".venv/bin").mkdir(parents=True)
    bin_dir.mkdir()
    shutil.copy(REPO / "proxytune", top / "proxytune")
    shutil.copy(REPO / "pyproject.toml", top / "pyproject.toml")
    fake(top / ".venv/bin/python", "exit 0\n")
    for stamp in (".installed", ".installed-test"):
        (top / ".venv" / stamp).touch()
    fake(bin_dir / "apt-get", f'case "$*" in *install*) echo "begin $$" >> {log}; sleep 1; echo "end $$" >> {log};; esac\n')
    fake(bin_dir / "dpkg-query", "echo 'deinstall ok config-files'\n")
    fake(bin_dir / "id", 'if [ "$1" = -u ]; then echo 0; else exec /usr/bin/id "$@"; fi\n')
    env = {**{k: v for k, v in os.environ.items() if k != "PROXYTUNE_NO_INSTALL"},
           "PATH": f"{bin_dir}:{os.environ['PATH']}", "PROXYTUNE_STATE_DIR": str(tmp_path / "state")}
    runs = [subprocess.Popen([str(top / "proxytune"), "doctor", "--help"][:2], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for _ in range(2)]
    for r in runs:
        r.wait(timeout=60)
    lines = log.read_text().split("\n")[:-1]
    assert [w.split()[0] for w in lines] == ["begin", "end", "begin", "end"], lines
    assert lines[0].split()[1] == lines[1].split()[1]                 # one apt-get ran from begin to end alone
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700

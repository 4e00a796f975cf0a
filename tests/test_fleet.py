"""`proxytune fleet` over real hosts on this machine (tests/fleet_hosts.py):
each host is its own network namespace with its own root and state dir,
reached by Ansible over real ssh that sends no packet. One more host's
ProxyCommand fails: it is unreachable. The hosts get different net.*
values, so the hosts x settings matrix shows a real difference.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, needs_root
from fleet_hosts import NET_ONLY_PROFILE, namespace_hosts

pytestmark = [needs_root, pytest.mark.skipif(
    not (shutil.which("ansible-playbook") and os.path.exists("/usr/sbin/sshd")),
    reason="needs ansible-playbook and openssh-server (make test installs them as root)")]

PROFILE = NET_ONLY_PROFILE
# host -> values set in its namespace before the test
HOSTS = {"pxa": {"net.core.somaxconn": "100000", "net.ipv4.tcp_fin_timeout": "20",
                 "net.ipv4.ip_local_port_range": "1024 65535"},
         "pxb": {},
         "pxc": {"net.core.somaxconn": "9000"}}
def _sh(*argv):
    return subprocess.run(argv, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def fleet_hosts(tmp_path_factory):
    d = tmp_path_factory.mktemp("fleet")
    (d / "net-only.toml").write_text(PROFILE)
    with namespace_hosts(d, HOSTS, unreachable=("pxdown",)) as fh:
        yield fh


def fleet(env_dir: Path, *args, timeout=240):
    env = {**os.environ, "PROXYTUNE_STATE_DIR": str(env_dir / "controller-state"),
           "ANSIBLE_HOME": str(env_dir / "ansible-home"), "ANSIBLE_SSH_CONTROL_PATH_DIR": str(env_dir / "cp"),
           "ANSIBLE_TIMEOUT": "60"}     # a busy 2-core machine can take more than ssh's default 10 s to connect
    argv = [str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "fleet", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)


def ns_value(fleet_hosts, host, key):
    return _sh("ip", "netns", "exec", fleet_hosts["ns"][host], "sysctl", "-n", key).stdout.split()


def common(fh):
    return ["-i", str(fh["dir"] / "hosts.ini"), "-p", str(fh["dir"] / "net-only.toml")]


def test_check_gives_a_matrix_with_real_differences_and_an_unreachable_host(fleet_hosts):
    r = fleet(fleet_hosts["dir"], "check", *common(fleet_hosts), "--json")
    assert r.returncode == 2, r.stderr           # pxdown is unreachable; the others still finish
    data = json.loads(r.stdout)["data"]
    hosts = data["hosts"]
    assert {h: hosts[h]["status"] for h in hosts} == {"pxa": "ok", "pxb": "ok", "pxc": "ok", "pxdown": "unreachable"}
    status = {h: {s["setting"]: s["status"] for s in hosts[h]["settings"]} for h in ("pxa", "pxb", "pxc")}
    assert set(status["pxa"].values()) == {"met"}
    assert set(status["pxb"].values()) == {"drift"}
    assert status["pxc"]["sysctl:net.core.somaxconn"] == "met"
    assert status["pxc"]["sysctl:net.ipv4.tcp_fin_timeout"] == "drift"
    current = {h: {s["setting"]: s["current_text"] for s in hosts[h]["settings"]} for h in ("pxa", "pxb", "pxc")}
    assert [current[h]["sysctl:net.core.somaxconn"] for h in ("pxa", "pxb", "pxc")] == ["100000", "4096", "9000"]
    assert hosts["pxa"]["fingerprint"]["kernel"] == os.uname().release
    for h in ("pxa", "pxb", "pxc", "pxdown"):
        assert f"{h}:" in r.stderr                # progress, one line per host
    # the matrix, in the terminal and as Markdown/HTML
    out = fleet_hosts["dir"] / "check.json"
    out.write_text(r.stdout)
    rep = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "report", "fleet", str(out),
                          "-o", str(fleet_hosts["dir"] / "report")], capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    md = (fleet_hosts["dir"] / "report" / "fleet.md").read_text()
    assert "| sysctl:net.core.somaxconn | >= 8192 | 100000 (met) | 4096 (DRIFT) | 9000 (met) | - |" in md
    assert "| pxdown | unreachable |" in md


def test_without_the_unreachable_host_drift_exits_1(fleet_hosts):
    r = fleet(fleet_hosts["dir"], "check", *common(fleet_hosts), "--limit", "pxa,pxc")
    assert r.returncode == 1, r.stdout + r.stderr
    r = fleet(fleet_hosts["dir"], "check", *common(fleet_hosts), "--limit", "pxa")
    assert r.returncode == 0, r.stdout + r.stderr


def test_canary_that_fails_verify_is_rolled_back_and_nobody_else_changes(fleet_hosts):
    before = {h: ns_value(fleet_hosts, h, "net.ipv4.tcp_fin_timeout") for h in ("pxb", "pxc")}
    r = fleet(fleet_hosts["dir"], "apply", *common(fleet_hosts), "--limit", "all:!pxdown", "--canary", "pxb",
              "--verify-cmd", "sh -c 'test \"$PROXYTUNE_FLEET_HOST\" = pxb && exit 3'", "--yes", "--json")
    assert r.returncode == 2, r.stderr
    data = json.loads(r.stdout)["data"]
    assert data["hosts"]["pxb"]["status"] == "failed" and data["hosts"]["pxb"]["rolled_back"] is True
    assert "canary pxb failed verify" in data["stopped"]
    assert data["hosts"]["pxc"]["status"] == "skipped"
    after = {h: ns_value(fleet_hosts, h, "net.ipv4.tcp_fin_timeout") for h in ("pxb", "pxc")}
    assert after == before == {"pxb": ["60"], "pxc": ["60"]}


def test_apply_with_canary_then_fleet_rollback_restores_every_host(fleet_hosts):
    r = fleet(fleet_hosts["dir"], "apply", *common(fleet_hosts), "--limit", "all:!pxdown", "--canary", "pxc",
              "--serial", "1", "--persist", "--yes", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    persisted = fleet_hosts["dir"] / "pxb/root/etc/sysctl.d/90-proxytune.conf"     # under pxb's own root
    assert "net.ipv4.ip_local_port_range = 1024 65535" in persisted.read_text()
    data = json.loads(r.stdout)["data"]
    assert all(h["status"] == "ok" and h["summary"]["drift"] == 0 for h in data["hosts"].values())
    assert data["hosts"]["pxa"]["journal"] is None       # already met: nothing to journal
    assert ns_value(fleet_hosts, "pxb", "net.ipv4.ip_local_port_range") == ["1024", "65535"]
    assert ns_value(fleet_hosts, "pxa", "net.core.somaxconn") == ["100000"]   # never lowered
    assert fleet(fleet_hosts["dir"], "check", *common(fleet_hosts), "--limit", "all:!pxdown").returncode == 0

    r = fleet(fleet_hosts["dir"], "rollback", *common(fleet_hosts), "--limit", "all:!pxdown", "--yes", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)["data"]
    assert sorted(data["hosts"]) == ["pxb", "pxc"] and data["state"] == "rolled-back"
    assert ns_value(fleet_hosts, "pxb", "net.ipv4.ip_local_port_range") == ["32768", "60999"]
    assert ns_value(fleet_hosts, "pxb", "net.core.somaxconn") == ["4096"]
    assert ns_value(fleet_hosts, "pxc", "net.ipv4.tcp_fin_timeout") == ["60"]
    assert not persisted.exists()
    r = fleet(fleet_hosts["dir"], "rollback", *common(fleet_hosts), "--yes")
    assert r.returncode == 2 and "nothing to roll back" in r.stderr


def test_plan_and_doctor_change_nothing_and_report_every_host(fleet_hosts):
    before = ns_value(fleet_hosts, "pxb", "net.ipv4.ip_local_port_range")
    r = fleet(fleet_hosts["dir"], "plan", *common(fleet_hosts), "--limit", "pxb,pxdown", "--json")
    assert r.returncode == 2, r.stderr
    hosts = json.loads(r.stdout)["data"]["hosts"]
    assert hosts["pxb"]["status"] == "ok" and hosts["pxdown"]["status"] == "unreachable"
    assert {s["status"] for s in hosts["pxb"]["settings"]} == {"drift"}
    assert ns_value(fleet_hosts, "pxb", "net.ipv4.ip_local_port_range") == before
    r = fleet(fleet_hosts["dir"], "doctor", *common(fleet_hosts), "--limit", "pxa")
    assert r.returncode in (0, 1), r.stderr              # 1: a capability (kprobes, counters) is missing there
    assert "can: root" in r.stdout and "1 host(s): 1 ok" in r.stdout
    r = fleet(fleet_hosts["dir"], "doctor", *common(fleet_hosts), "--limit", "pxa", "--json")
    assert json.loads(r.stdout)["data"]["hosts"]["pxa"]["capabilities"]["root"] is True


# ---------------------------------------------------------------- hostile input: refused before any host is touched

HOSTILE_YAML = """all:
  hosts:
    {name}:
      ansible_connection: local
"""


@pytest.mark.parametrize("name", ['"px;touch /tmp/pt-fleet-owned"', '"$(id)"', '"px\\nother"', '"{{ 7 * 7 }}"'])
def test_hostile_inventory_names_are_refused(tmp_path, name):
    inv = tmp_path / "inv.yml"
    inv.write_text(HOSTILE_YAML.format(name=name))
    r = fleet(tmp_path, "check", "-i", str(inv))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("proxytune: error:") and "Traceback" not in r.stderr
    assert not (tmp_path / "controller-state").exists()
    assert not os.path.exists("/tmp/pt-fleet-owned")


@pytest.mark.parametrize("args", [["-p", "linux/proxy{{ lookup('pipe','id') }}"], ["--only", "sysctl:net.*;id"],
                                  ["--limit", "{{ 7*7 }}"], ["--only", "--yes"]])
def test_hostile_profile_glob_and_limit_are_refused(tmp_path, args):
    inv = tmp_path / "inv.ini"
    inv.write_text("px ansible_connection=local\n")
    r = fleet(tmp_path, "check", "-i", str(inv), *args)
    assert r.returncode == 2 and r.stderr.startswith("proxytune: error:"), r.stderr


def test_apply_and_rollback_need_yes(tmp_path):
    inv = tmp_path / "inv.ini"
    inv.write_text("px ansible_connection=local\n")
    for cmd in ("apply", "rollback"):
        r = fleet(tmp_path, cmd, "-i", str(inv))
        assert r.returncode == 2 and "--yes" in r.stderr


def test_a_failing_host_stops_the_serial_rollout_before_the_next_batch(fleet_hosts):
    """pxb cannot even get its bundle directory (its state dir is under a
    regular file): with --serial 1 the rollout stops there; pxc, the next
    batch, is never touched."""
    d = fleet_hosts["dir"]
    inv = d / "broken.ini"
    blocker = d / "not-a-dir"
    blocker.write_text("")
    inv.write_text((d / "hosts.ini").read_text().replace(f"proxytune_state_dir={d / 'pxb' / 'state'}",
                                                         f"proxytune_state_dir={blocker / 'state'}"))
    before = ns_value(fleet_hosts, "pxc", "net.ipv4.tcp_fin_timeout")
    r = fleet(d, "apply", "-i", str(inv), "-p", str(d / "net-only.toml"), "--limit", "pxb,pxc", "--serial", "1",
              "--yes", "--json")
    assert r.returncode == 2, r.stderr
    hosts = json.loads(r.stdout)["data"]["hosts"]
    assert hosts["pxb"]["status"] == "failed" and "bundle refused" in hosts["pxb"]["error"]
    assert hosts["pxc"]["status"] == "skipped"
    assert ns_value(fleet_hosts, "pxc", "net.ipv4.tcp_fin_timeout") == before == ["60"]


def test_the_bundle_is_reproducible_and_the_playbook_passes_no_name_to_a_shell(tmp_path):
    import sys
    sys.path.insert(0, str(REPO))
    from proxytune.tune import fleet_play as fp
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one, digest = fp.bundle(tmp_path / "a")
    two, again = fp.bundle(tmp_path / "b")
    assert digest == again and one.read_bytes() == two.read_bytes()
    import tarfile
    names = tarfile.open(one).getnames()
    assert "cli.py" in names and "tune/fleet.py" in names
    assert not any("__pycache__" in n or n.startswith(("tests/", ".venv")) for n in names)
    bundle_id = f"{digest[:16]}-0123456789ab"
    run = fp.run_task(["tune", "check", "--json"], bundle_id, digest, (0, 1), 60)
    book = json.loads(fp.playbook(fp.with_dependencies(run, True), one, 60))
    tasks = book[0]["tasks"]
    assert all(t["timeout"] == 90 for t in tasks)
    assert not any(m in t for t in tasks for m in ("ansible.builtin.shell", "ansible.builtin.command",
                                                   "ansible.builtin.raw", "ansible.builtin.script"))
    assert all(isinstance(t[fp.MODULE]["argv"], list) for t in tasks if fp.MODULE in t)
    # one task per host unless a host lacks proxytune's Python modules (then apt and the run again)
    assert [t["name"] for t in tasks if "when" not in t] == [fp.RUN_TASK]
    import base64
    assert base64.b64decode(book[0]["vars"]["proxytune_bundle"]) == one.read_bytes()


def test_an_unwritable_fleet_record_is_one_error_line_not_a_traceback(fleet_hosts, tmp_path):
    blocker = tmp_path / "state-is-a-file"
    blocker.write_text("")
    env_dir = tmp_path
    r = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "fleet", "apply",
                        *common(fleet_hosts), "--limit", "pxa", "--yes"], capture_output=True, text=True,
                       env={**os.environ, "PROXYTUNE_STATE_DIR": str(blocker), "ANSIBLE_TIMEOUT": "60",
                            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(env_dir / "cp")}, timeout=240)
    assert r.returncode == 2 and r.stderr.startswith("proxytune: error: cannot record the fleet run"), r.stderr
    assert "Traceback" not in r.stderr


def test_the_bundle_carries_what_the_wheel_carries():
    """The bundle's data globs are pyproject's package-data: a data file added for the wheel (the
    result schema was one) and forgotten here breaks every remote run with no JSON to show."""
    import tomllib
    from proxytune.tune import fleet_play
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    wheel = {f"{pkg.removeprefix('proxytune.').replace('.', '/')}/{glob}" for pkg, globs in data.items()
             for glob in globs if not glob.endswith(".py")}          # the bundle ships every .py anyway
    assert wheel == set(fleet_play.DATA)
    # and its Python packages, found by their __init__.py: a top-level package the bundle misses (proxies/
    # was, when a list named them) breaks every remote run; one pyproject misses breaks the wheel
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    tops = {pkg.split(".")[1] for pkg in packages if pkg.count(".") >= 1}
    assert tops == set(fleet_play.code_tops(REPO)) - {"cli.py"}

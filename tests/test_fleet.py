"""`proxytune fleet` over real hosts on this machine: each host is its own
network namespace with its own root and state dir, reached by Ansible over
real ssh that sends no packet: the ssh ProxyCommand starts `sshd -i` inside
the namespace (with a temp host key and authorized key). One more host's
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

pytestmark = [needs_root, pytest.mark.skipif(
    not (shutil.which("ansible-playbook") and os.path.exists("/usr/sbin/sshd")),
    reason="needs ansible-playbook and openssh-server (make test installs them as root)")]

PROFILE = """
[profile]
description = "fleet test: only namespaced net.* settings"
os = "linux"

[sysctl."net.core.somaxconn"]
at_least = 8192
reason = "listen backlog"
source = "test"

[sysctl."net.ipv4.tcp_fin_timeout"]
at_most = 30
reason = "FIN-WAIT-2"
source = "test"

[sysctl."net.ipv4.ip_local_port_range"]
covers = [1024, 65535]
reason = "ephemeral ports"
source = "test"
"""
# host -> values set in its namespace before the test
HOSTS = {"pxa": {"net.core.somaxconn": "100000", "net.ipv4.tcp_fin_timeout": "20",
                 "net.ipv4.ip_local_port_range": "1024 65535"},
         "pxb": {},
         "pxc": {"net.core.somaxconn": "9000"}}
SSHD_CONFIG = """HostKey {d}/host_key
AuthorizedKeysFile {d}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
Subsystem sftp /usr/lib/openssh/sftp-server
"""
# sshd wants its privilege-separation dir /run/sshd: a private tmpfs /run in
# a private mount namespace gives it one without touching the host's /run.
PROXY = """#!/bin/sh
exec ip netns exec {ns} unshare -m sh -c 'mount -t tmpfs -o mode=0755 pt-run /run && mkdir -m 0755 /run/sshd && \
exec /usr/sbin/sshd -i -f {d}/sshd_config -E {d}/sshd-{name}.log'
"""


def _sh(*argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def fleet_hosts(tmp_path_factory):
    d = tmp_path_factory.mktemp("fleet")
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key"))
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client_key"))
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    (d / "sshd_config").write_text(SSHD_CONFIG.format(d=d))
    key = " ".join((d / "host_key.pub").read_text().split()[:2])
    (d / "known_hosts").write_text("".join(f"{h} {key}\n" for h in HOSTS))
    namespaces = {h: f"pt-fleet-{os.getpid()}-{h}" for h in HOSTS}
    lines = ["[proxies]"]
    try:
        for h, ns in namespaces.items():
            _sh("ip", "netns", "add", ns)
            for k, v in HOSTS[h].items():
                _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"{k}={v}")
            proxy = d / f"proxy-{h}.sh"
            proxy.write_text(PROXY.format(ns=ns, d=d, name=h))
            proxy.chmod(0o755)
            for sub in ("root/etc", "state"):
                (d / h / sub).mkdir(parents=True)
            lines.append(f"{h} ansible_ssh_common_args='-o ProxyCommand={proxy}' "
                         f"proxytune_root={d / h / 'root'} proxytune_state_dir={d / h / 'state'}")
        lines.append("pxdown ansible_ssh_common_args='-o ProxyCommand=/bin/false'")
        lines += ["[proxies:vars]", "ansible_user=root", f"ansible_ssh_private_key_file={d / 'client_key'}",
                  f"ansible_ssh_extra_args='-o UserKnownHostsFile={d / 'known_hosts'} -o StrictHostKeyChecking=yes'",
                  "ansible_python_interpreter=/usr/bin/python3", f"ansible_remote_tmp={d / 'remote-tmp'}"]
        (d / "hosts.ini").write_text("\n".join(lines) + "\n")
        (d / "net-only.toml").write_text(PROFILE)
        yield {"dir": d, "ns": namespaces}
    finally:
        for sock in (d / "cp").glob("*") if (d / "cp").exists() else []:
            subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True)
        for ns in namespaces.values():
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


def fleet(env_dir: Path, *args, timeout=240):
    env = {**os.environ, "PROXYTUNE_STATE_DIR": str(env_dir / "controller-state"),
           "ANSIBLE_HOME": str(env_dir / "ansible-home"), "ANSIBLE_SSH_CONTROL_PATH_DIR": str(env_dir / "cp")}
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
              "--serial", "1", "--yes", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
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

"""Fleet hosts on this machine, for tests and the fleet benchmark: each host
is a network namespace with its own root and state dir, reached over real
ssh that sends no packet (the ssh ProxyCommand starts `sshd -i` inside the
namespace, with a temp host key and authorized key). Hosts named in
`unreachable` get a ProxyCommand that fails.

    python3 tests/fleet_hosts.py --hosts 6 -- COMMAND ...
makes six hosts, runs COMMAND with $FLEET_INVENTORY set, and removes them.
"""

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

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
# A profile whose settings all live in a network namespace: apply and rollback on these hosts
# change nothing outside them.
NET_ONLY_PROFILE = """
[profile]
description = "fleet hosts: per-namespace net.* settings only"
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
# sshd wants its privilege-separation dir /run/sshd: a private tmpfs /run in
# a private mount namespace gives it one without touching the host's /run.
PROXY = """#!/bin/sh
{enter}exec ip netns exec {ns} unshare -m sh -c 'mount -t tmpfs -o mode=0755 pt-run /run && mkdir -m 0755 /run/sshd && \
exec /usr/sbin/sshd -i -f {d}/sshd_config -E {d}/sshd-{name}.log'
"""


def _sh(*argv):
    return subprocess.run(argv, check=True, capture_output=True, text=True)


def _keys(d: Path, names) -> None:
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key"))
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client_key"))
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    (d / "sshd_config").write_text(SSHD_CONFIG.format(d=d))
    key = " ".join((d / "host_key.pub").read_text().split()[:2])
    (d / "known_hosts").write_text("".join(f"{h} {key}\n" for h in names))


def _host_line(d: Path, name: str, ns: str, sysctls: dict, cgroup: Path | None = None) -> str:
    _sh("ip", "netns", "add", ns)
    for k, v in sysctls.items():
        _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"{k}={v}")
    proxy = d / f"proxy-{name}.sh"
    # the benchmark counts a host's CPU (its sshd and all it starts) in that host's own cgroup
    enter = f"echo $$ > {cgroup / 'cgroup.procs'}\n" if cgroup else ""
    proxy.write_text(PROXY.format(ns=ns, d=d, name=name, enter=enter))
    proxy.chmod(0o755)
    for sub in ("root/etc", "state"):
        (d / name / sub).mkdir(parents=True)
    return (f"{name} ansible_ssh_common_args='-o ProxyCommand={proxy}' "
            f"proxytune_root={d / name / 'root'} proxytune_state_dir={d / name / 'state'}")


@contextlib.contextmanager
def namespace_hosts(d: Path, hosts: dict[str, dict], unreachable: tuple[str, ...] = (), cgroups=None):
    """Yield {"dir", "inventory", "ns"}; namespaces and ssh masters removed after.
    `cgroups(name)`, when given, is the cgroup directory each host's sshd enters."""
    d = Path(d)
    _keys(d, hosts)
    namespaces = {h: f"pt-fleet-{os.getpid()}-{h}" for h in hosts}
    lines = ["[proxies]"]
    try:
        lines += [_host_line(d, h, ns, hosts[h], cgroups(h) if cgroups else None) for h, ns in namespaces.items()]
        lines += [f"{h} ansible_ssh_common_args='-o ProxyCommand=/bin/false'" for h in unreachable]
        lines += ["[proxies:vars]", "ansible_user=root", f"ansible_ssh_private_key_file={d / 'client_key'}",
                  f"ansible_ssh_extra_args='-o UserKnownHostsFile={d / 'known_hosts'} -o StrictHostKeyChecking=yes'",
                  "ansible_python_interpreter=/usr/bin/python3", f"ansible_remote_tmp={d / 'remote-tmp'}"]
        (d / "hosts.ini").write_text("\n".join(lines) + "\n")
        yield {"dir": d, "inventory": d / "hosts.ini", "ns": namespaces}
    finally:
        close_masters(d / "cp")
        for ns in namespaces.values():
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


def close_masters(control_dir: Path) -> None:
    """End the ssh ControlPersist masters Ansible left in control_dir (by their socket)."""
    for sock in Path(control_dir).glob("*") if Path(control_dir).exists() else []:
        subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    with tempfile.TemporaryDirectory(prefix="pt-fleet-hosts-") as tmp, \
            namespace_hosts(Path(tmp), {f"px{i:03d}": {} for i in range(a.hosts)}) as fh:
        env = {**os.environ, "FLEET_INVENTORY": str(fh["inventory"]), "ANSIBLE_SSH_CONTROL_PATH_DIR": f"{tmp}/cp"}
        return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())

"""The boot order tune/sysctld.py claims, checked against the real consumers.

For each layout of sysctl.d files under a sandbox root, a private mount and
network namespace (`unshare -m -n`) gets that layout bind-mounted over
/etc/sysctl.d, /run/sysctl.d, /usr/local/lib/sysctl.d, /usr/lib/sysctl.d and
/etc/sysctl.conf; then systemd-sysctl (restricted to net.core) or procps
`sysctl --system` runs there. The value it leaves in the namespace's
net.core.somaxconn must be the one we predict, and the setting is reported
"overridden at boot" exactly when that value is below what the profile wants.
Only net.core.somaxconn appears in the files: it is private to the namespace.
"""

import os
import shutil
import subprocess

import pytest

from conftest import needs_root
from proxytune.tune.backends.sysctl import SysctlBackend
from proxytune.tune.host import Host
from proxytune.tune.model import Change, Setting
from proxytune.tune import sysctld

WANTED = 8192
OURS = {"etc/sysctl.d/90-proxytune.conf": f"net.core.somaxconn = {WANTED}\n"}
LAYOUTS = {
    "later-etc-file-lowers": {**OURS, "etc/sysctl.d/99-local.conf": "# local\nnet.core.somaxconn = 128\n"},
    "etc-masks-same-name-in-usr-lib": {**OURS, "usr/lib/sysctl.d/99-local.conf": "net.core.somaxconn = 128\n",
                                       "etc/sysctl.d/99-local.conf": "net.core.somaxconn = 9000\n"},
    "dev-null-link-masks": {**OURS, "usr/lib/sysctl.d/95-vendor.conf": "net.core.somaxconn = 128\n",
                            "etc/sysctl.d/95-vendor.conf": "->/dev/null"},
    "sysctl-conf-through-99-link": {**OURS, "etc/sysctl.conf": "net.core.somaxconn = 256\n",
                                    "etc/sysctl.d/99-sysctl.conf": "->../sysctl.conf"},
    "run-dir": {**OURS, "run/sysctl.d/91-runtime.conf": "net.core.somaxconn = 300\n"},
    "usr-local-lib": {**OURS, "usr/local/lib/sysctl.d/95-local.conf": "net.core.somaxconn = 400\n"},
    "earlier-file-loses": {"usr/lib/sysctl.d/10-vendor.conf": "net.core.somaxconn = 128\n", **OURS},
    "slash-form": {**OURS, "etc/sysctl.d/98-slash.conf": "net/core/somaxconn = 500\n"},
    "dash-prefix": {**OURS, "etc/sysctl.d/98-dash.conf": "-net.core.somaxconn = 600\n"},
    "raise-later-is-fine": {**OURS, "etc/sysctl.d/99-more.conf": "net.core.somaxconn = 16384\n"},
    "glob-loses-to-a-named-key": {**OURS, "etc/sysctl.d/99-glob.conf": "net.core.somax* = 222\n"},
    "glob-alone-applies": {"etc/sysctl.d/99-glob.conf": "net.core.somax* = 222\n"},
    "comments-and-blank-lines": {**OURS, "etc/sysctl.d/99-c.conf": "; net.core.somaxconn = 1\n\n"
                                 "# net.core.somaxconn = 2\n"},
}
SYSTEMD_SYSCTL = next((p for p in ("/lib/systemd/systemd-sysctl", "/usr/lib/systemd/systemd-sysctl")
                       if os.access(p, os.X_OK)), None)
CONSUMERS = {"systemd-sysctl": [SYSTEMD_SYSCTL, "--prefix=net.core"], "procps": ["sysctl", "--system"]}

# In the namespace only: empty tmpfs where /run and /usr/local/lib were, then the sandbox dirs bound over.
SCRIPT = """
R="$1"; shift
mount -t tmpfs proxytune-test /run
mount -t tmpfs proxytune-test /usr/local/lib
for d in etc/sysctl.d run/sysctl.d usr/local/lib/sysctl.d usr/lib/sysctl.d; do
    mkdir -p "/$d"; mount --bind "$R/$d" "/$d"
done
mount --bind "$R/etc/sysctl.conf" /etc/sysctl.conf
before=$(cat /proc/sys/net/core/somaxconn)
"$@" >/dev/null 2>&1 || true
echo "$before $(cat /proc/sys/net/core/somaxconn)"
"""


def make_layout(root, layout: dict) -> None:
    for d in ("etc/sysctl.d", "run/sysctl.d", "usr/local/lib/sysctl.d", "usr/lib/sysctl.d"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "etc/sysctl.conf").touch()
    for rel, content in layout.items():
        path = root / rel
        if content.startswith("->"):
            path.unlink(missing_ok=True)
            path.symlink_to(content[2:])
        else:
            path.write_text(content)


def consumer_result(root, argv) -> tuple[int, int]:
    r = subprocess.run(["unshare", "-m", "-n", "--propagation", "private", "bash", "-euc", SCRIPT, "x",
                        str(root), *argv], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    before, after = r.stdout.split()
    return int(before), int(after)


def predicted(host, initial: int) -> int:
    lines = sysctld.lines_for(host, "net.core.somaxconn")
    return int(lines[-1].value) if lines else initial


@needs_root
@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_boot_order_matches_the_consumer(name, consumer, tmp_path):
    argv = CONSUMERS[consumer]
    if not argv[0] or not shutil.which(argv[0]):
        pytest.skip(f"{consumer} is not installed")
    root = tmp_path / "root"
    make_layout(root, LAYOUTS[name])
    host = Host(root=root, state_dir=tmp_path / "state")
    initial, at_boot = consumer_result(root, argv)
    assert predicted(host, initial) == at_boot, (name, consumer)
    setting = Setting("sysctl", "net.core.somaxconn", "at_least", WANTED, "r", "s")
    change = SysctlBackend(host).at_boot(Change(setting, current=WANTED, status="met"))
    assert bool(change.boot) == (at_boot < WANTED), change.boot
    if change.boot:
        last = sysctld.lines_for(host, "net.core.somaxconn")[-1]
        assert change.boot.startswith(f"overridden at boot by {last.where} ")
        assert change.status == ("drift" if "90-proxytune.conf" in str(LAYOUTS[name]) else "met")

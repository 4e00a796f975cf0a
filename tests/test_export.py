"""Exports: every format renders; the Ansible playbook passes
ansible-playbook --syntax-check and, run with -c local inside a network
namespace, applies net.* settings without lowering higher values."""

import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import REPO, needs_root

FORMATS = ["sysctl.d", "limits.d", "systemd", "tuned", "ansible"]
has_ansible = shutil.which("ansible-playbook") is not None


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.host  # the tuned format asks tuned-adm its version (the tier: tests/tiers.py)
def test_every_linux_format_renders(fmt, cli):
    r = cli("tune", "export", "--format", fmt, "--service", "squid", "--user", "proxy",
            "--cache-dir", "/var/spool/squid")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("# proxytune profile linux/proxy")
    expected = {"sysctl.d": "net.ipv4.tcp_syncookies = 1", "limits.d": "proxy\thard\tnofile\t65536",
                "systemd": "LimitNOFILE=65536", "tuned": "net.core.somaxconn=>8192",
                "ansible": "ansible.posix.sysctl:"}[fmt]
    assert expected in r.output


@pytest.mark.host  # asks tuned-adm its version (the tier: tests/tiers.py)
def test_tuned_uses_assignment_modifiers_and_lists_what_it_cannot_carry(cli):
    out = cli("tune", "export", "--format", "tuned", "--cache-dir", "/var/spool/squid").output
    assert "net.ipv4.tcp_fin_timeout=<30" in out
    assert "net.ipv4.tcp_tw_reuse=1" in out
    assert "not expressible as tuned: mount:/var/spool/squid:noatime" in out


def ansible_env(tmp_path):
    """Keep Ansible's own state (~/.ansible) inside the test's temp dir."""
    home = tmp_path / "ansible-home"
    return {**os.environ, "ANSIBLE_HOME": str(home), "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
            "ANSIBLE_REMOTE_TEMP": str(home / "rtmp"), "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3"}


@pytest.mark.skipif(not has_ansible, reason="ansible-playbook is not installed (make test installs it as root)")
def test_playbook_passes_syntax_check(tmp_path, cli):
    book = tmp_path / "proxytune.yml"
    r = cli("tune", "export", "--format", "ansible", "--service", "squid", "--user", "proxy",
            "--cache-dir", "/var/spool/squid", "-o", str(book))
    assert r.exit_code == 0
    text = book.read_text()
    for module in ("ansible.posix.sysctl", "community.general.pam_limits", "ansible.posix.mount",
                   "ansible.builtin.copy"):
        assert module in text
    r = subprocess.run(["ansible-playbook", "--syntax-check", "-i", "localhost,", str(book)],
                       capture_output=True, text=True, env=ansible_env(tmp_path), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_root
@pytest.mark.skipif(not has_ansible, reason="ansible-playbook is not installed (make test installs it as root)")
def test_playbook_applies_net_settings_in_a_netns(tmp_path, cli):
    book = tmp_path / "net.yml"
    cli("tune", "export", "--format", "ansible", "--only", "sysctl:net.*", "-o", str(book))
    conf = tmp_path / "90-proxytune.conf"
    script = f"""
echo 100000 > /proc/sys/net/core/somaxconn
ansible-playbook -c local -i localhost, -e proxytune_sysctl_file={conf} {book} > {tmp_path}/run.log
cat /proc/sys/net/core/somaxconn /proc/sys/net/ipv4/tcp_fin_timeout /proc/sys/net/ipv4/ip_local_port_range \
    /proc/sys/net/ipv4/tcp_tw_reuse /proc/sys/net/ipv4/tcp_max_syn_backlog
"""
    r = subprocess.run(["unshare", "-n", "bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                       env=ansible_env(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr + (tmp_path / "run.log").read_text()
    # somaxconn was higher than the profile's 8192: left alone; the rest applied
    assert r.stdout.split() == ["100000", "30", "1024", "65535", "1", "8192"]
    assert "net.ipv4.tcp_fin_timeout=30" in conf.read_text().replace(" ", "")
    assert "net.core.somaxconn" not in conf.read_text()
    # netdev_max_backlog is absent in the namespace: skipped, not failed
    assert "failed=0" in (tmp_path / "run.log").read_text()


# ---------------------------------------------------------------- each export, loaded by its real consumer

# Inside `unshare -m -n`: every sysctl.d directory (and /etc/sysctl.conf) is
# covered by an empty one, so only the file under test loads, and only into
# the test's own network namespace.
HIDE_SYSCTL_DIRS = """
for d in /etc/sysctl.d /run/sysctl.d /usr/local/lib/sysctl.d /usr/lib/sysctl.d /lib/sysctl.d; do
  [ -d "$d" ] && mount --bind "$D/empty" "$d"
done
[ -e /etc/sysctl.conf ] && mount --bind "$D/empty.conf" /etc/sysctl.conf
mount --bind "$D/sysctl.d" /etc/sysctl.d
"""
# higher (or, for at-most, lower) than the profile wants: met, must stay as they are
MET_ALREADY = "sysctl -qw net.core.somaxconn=100000 net.ipv4.tcp_fin_timeout=10"
SHOW = ("net.core.somaxconn", "net.ipv4.tcp_fin_timeout", "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_tw_reuse", "net.ipv4.tcp_max_syn_backlog")


def sandbox_dirs(tmp_path):
    for d in ("empty", "sysctl.d", "tuned"):
        (tmp_path / d).mkdir()
    (tmp_path / "empty.conf").write_text("")
    return {**os.environ, "D": str(tmp_path), "PT": f"{REPO}/.venv/bin/python {REPO}/cli.py"}


def values(stdout: str) -> dict[str, str]:
    """The `sysctl -n` block the script ends with: one line per SHOW key."""
    lines = stdout.strip().splitlines()[-len(SHOW):]
    return dict(zip(SHOW, (" ".join(line.split()) for line in lines)))


def ns_script(body: str, env, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "-m", "-n", "bash", "-euo", "pipefail", "-c", body], capture_output=True,
                          text=True, env=env, timeout=timeout)


@needs_root
@pytest.mark.parametrize("loader", ["sysctl --system", "/lib/systemd/systemd-sysctl"])
def test_sysctl_d_never_lowers_as_its_loader_applies_it(tmp_path, loader):
    if not os.path.exists(loader.split()[0]) and not shutil.which(loader.split()[0]):
        pytest.skip(f"{loader} is not installed")
    env = sandbox_dirs(tmp_path)
    r = ns_script(f"""{MET_ALREADY}
$PT tune export --format sysctl.d --only 'sysctl:net.*' -o "$D/sysctl.d/90-proxytune.conf" 2>/dev/null
{HIDE_SYSCTL_DIRS}
{loader} >"$D/loader.log" 2>&1 || true
sysctl -n {' '.join(SHOW)}""", env)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "sysctl.d/90-proxytune.conf").read_text()
    assert "Computed on" in text and "regenerate it on each host" in text
    assert "net.core.somaxconn: already 100000 here" in text
    assert "net.core.somaxconn =" not in text and "net.ipv4.tcp_fin_timeout =" not in text
    assert values(r.stdout) == {"net.core.somaxconn": "100000", "net.ipv4.tcp_fin_timeout": "10",
                                "net.ipv4.ip_local_port_range": "1024 65535", "net.ipv4.tcp_tw_reuse": "1",
                                "net.ipv4.tcp_max_syn_backlog": "8192"}, (tmp_path / "loader.log").read_text()


TUNED_BASE = "[main]\nsummary=test base (net.* only)\n[sysctl]\nnet.ipv4.tcp_keepalive_time=600\n"
PRIVATE_BUS = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>system</type><listen>unix:path={d}/bus</listen><auth>EXTERNAL</auth>
<policy context="default"><allow user="root"/><allow own="*"/><allow send_destination="*"/>
<allow receive_sender="*"/></policy></busconfig>
"""


@needs_root
@pytest.mark.skipif(not (shutil.which("tuned") and shutil.which("dbus-daemon")),
                    reason="needs Debian's tuned and dbus-daemon (make test installs them as root)")
def test_tuned_daemon_loads_the_export_over_its_base_verifies_and_off_restores(tmp_path):
    """Debian's tuned daemon on a private D-Bus, private /run and /etc/tuned,
    in a network namespace; the base profile is a test one with net.* only,
    so nothing outside the namespace is tuned."""
    env = sandbox_dirs(tmp_path)
    shutil.copy("/etc/tuned/tuned-main.conf", tmp_path / "tuned/tuned-main.conf")
    (tmp_path / "tuned/active_profile").write_text("")
    (tmp_path / "tuned/profile_mode").write_text("manual\n")
    (tmp_path / "tuned/pt-net-base").mkdir()
    (tmp_path / "tuned/proxytune").mkdir()
    (tmp_path / "tuned/pt-net-base/tuned.conf").write_text(TUNED_BASE)
    (tmp_path / "bus.conf").write_text(PRIVATE_BUS.format(d=tmp_path))
    show = f"sysctl -n {' '.join(SHOW)} net.ipv4.tcp_keepalive_time"
    r = ns_script(f"""mount -t tmpfs pt-run /run
{HIDE_SYSCTL_DIRS}
mount --bind "$D/tuned" /etc/tuned
{MET_ALREADY}
# netdev_max_backlog is absent in a network namespace: the export leaves it out, so tuned verify can pass
$PT tune export --format tuned --only 'sysctl:net.*' --tuned-include pt-net-base -o /etc/tuned/proxytune/tuned.conf 2>/dev/null
$PT tune export --format sysctl.d --only 'sysctl:net.*' -o /etc/sysctl.d/90-proxytune.conf 2>/dev/null
dbus-daemon --config-file="$D/bus.conf" --fork --print-pid >"$D/bus.pid"
export DBUS_SYSTEM_BUS_ADDRESS="unix:path=$D/bus"
tuned --log "$D/tuned.log" --pid "$D/tuned.pid" 2>/dev/null & tuned_pid=$!
trap 'kill $tuned_pid; wait $tuned_pid || true; kill $(cat "$D/bus.pid")' EXIT
# wait for tuned's own D-Bus answer: `tuned-adm active` falls back to reading /etc/tuned when the
# bus name is not yet owned and prints "No current active profile." either way, so it cannot say
for i in $(seq 150); do
  dbus-send --system --print-reply --dest=com.redhat.tuned /Tuned com.redhat.tuned.control.is_running >/dev/null 2>&1 && break
  [ "$i" -lt 150 ] || {{ echo "tuned never answered on its D-Bus" >&2; exit 1; }}
  sleep 0.2
done
echo "== before"; {show}
tuned-adm profile proxytune >"$D/adm.log"
tuned-adm active >>"$D/adm.log"
tuned-adm verify >>"$D/adm.log"
echo "== active"; {show}
tuned-adm off
echo "== off"; {show}
""", env)
    log = tmp_path / "tuned.log"
    assert r.returncode == 0, r.stdout + r.stderr + (log.read_text()[-3000:] if log.exists() else "")
    blocks = {b.split("\n", 1)[0]: b.split("\n", 1)[1].split() for b in r.stdout.split("== ")[1:]}
    conf = (tmp_path / "tuned/proxytune/tuned.conf").read_text()
    assert "include=pt-net-base" in conf and "reapply_sysctl" in conf and "net.core.somaxconn=>8192" in conf
    assert "net.core.netdev_max_backlog: not readable here" in conf and "netdev_max_backlog=" not in conf
    adm = (tmp_path / "adm.log").read_text()
    assert "Current active profile: proxytune" in adm
    assert re.search(r"Veri?fication succeeded", adm)      # tuned 2.20 prints "Verfication"
    before, active, after_off = blocks["before"], blocks["active"], blocks["off"]
    # before: the namespace's own values; somaxconn/fin_timeout better than the profile already
    assert before[:2] == ["100000", "10"] and before[-1] == "7200"
    # active: the profile on top of its base (keepalive 600 comes from the base), nothing lowered
    assert active == ["100000", "10", "1024", "65535", "1", "8192", "600"]
    # off: tuned put back what was there
    assert after_off == before


def recap_changed(log: str) -> int:
    m = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", log)
    assert m, log[-2000:]
    return int(m.group(1))


@needs_root
@pytest.mark.skipif(not has_ansible, reason="ansible-playbook is not installed (make test installs it as root)")
def test_playbook_check_diff_reports_only_real_changes_then_runs_idempotently(tmp_path, cli):
    """--check --diff inside a network namespace: the reads run, exactly the
    drifting settings (and the new drop-in) show as changes; a real run makes
    them; a second real run changes nothing. No systemd as PID 1 here, so
    the daemon-reload handler is skipped, not failed."""
    book = tmp_path / "book.yml"
    cli("tune", "export", "--format", "ansible", "--only", "sysctl:net.*", "--only", "service:*", "--only", "limits:*",
        "--service", "pttest", "--user", "proxy", "-o", str(book))
    units = tmp_path / "units"
    units.mkdir()
    (tmp_path / "limits.d").mkdir()      # proxy's login limit is already above the profile's: met
    (tmp_path / "limits.d/50-site.conf").write_text("proxy\t-\tnofile\t100000\n")
    env = {**ansible_env(tmp_path), "D": str(tmp_path), "PT": f"{REPO}/.venv/bin/python {REPO}/cli.py"}
    run = (f"ansible-playbook -c local -i localhost, -e proxytune_sysctl_file={tmp_path}/90-proxytune.conf "
           f"-e proxytune_systemd_dir={units} -e proxytune_limits_file={tmp_path}/limits-out.conf {book}")
    r = subprocess.run(["unshare", "-m", "-n", "bash", "-euo", "pipefail", "-c", f"""{MET_ALREADY}
mount --bind "$D/limits.d" /etc/security/limits.d
$PT tune check --json --only 'sysctl:net.*' > "$D/audit.json" || true
{run} --check --diff > "$D/check.log"
sysctl -n net.ipv4.ip_local_port_range > "$D/after-check.txt"
ls "$D/units" > "$D/units-after-check.txt"
{run} > "$D/run1.log"
{run} > "$D/run2.log"
printf 'proxy\t-\tnofile\t1024\n' > "$D/limits.d/50-site.conf"
{run} --check > "$D/lowlimit.log"
sysctl -n {' '.join(SHOW)}"""], capture_output=True, text=True, env=env, timeout=400)
    logs = {n: (tmp_path / f"{n}.log").read_text() if (tmp_path / f"{n}.log").exists() else "" for n in
            ("check", "run1", "run2", "lowlimit")}
    assert r.returncode == 0, r.stderr + "".join(logs.values())[-3000:]
    audit = json.loads((tmp_path / "audit.json").read_text())["data"]["settings"]
    drifting = [s["key"] for s in audit if s["status"] == "drift"]
    assert "net.ipv4.ip_local_port_range" in drifting and "net.core.somaxconn" not in drifting
    # check mode: the drifting sysctls + drop-in directory + drop-in file, nothing else, nothing changed
    assert recap_changed(logs["check"]) == len(drifting) + 2, logs["check"]
    assert (tmp_path / "after-check.txt").read_text().split() == ["32768", "60999"]
    assert (tmp_path / "units-after-check.txt").read_text() == ""
    # met: never written (community.general.pam_limits itself touches an empty dest file under --check)
    out = tmp_path / "limits-out.conf"
    assert "read login limits for proxy" in logs["check"] and (not out.exists() or out.read_text() == "")
    assert recap_changed(logs["run1"]) == len(drifting) + 2
    assert recap_changed(logs["run2"]) == 0
    assert recap_changed(logs["lowlimit"]) == 1       # the login limit, now below the profile, is a change
    assert (units / "pttest.service.d/50-proxytune.conf").read_text().endswith("LimitNOFILE=65536\n")
    assert "reload systemd" in logs["run1"] and "failed=0" in logs["run1"]
    assert values(r.stdout)["net.core.somaxconn"] == "100000"          # never lowered
    assert values(r.stdout)["net.ipv4.ip_local_port_range"] == "1024 65535"


def test_playbook_never_puts_a_name_into_a_shell_unquoted(cli):
    """Reads are argv lists; the one shell task (prlimit over running
    processes) gets its service name through shlex quoting."""
    out = cli("tune", "export", "--format", "ansible", "--service", "squid", "--user", "proxy",
              "--cache-dir", "/var/spool/squid").output
    assert "ansible.builtin.command: \"" not in out          # no command strings, only argv
    assert '"findmnt", "-n", "-o", "TARGET", "--target", "/var/spool/squid"' in out
    assert 'n=squid\\n' in out and 'pgrep -x -- \\"$n\\"' in out     # quoted once, then only "$n"
    assert out.count("check_mode: false") == out.count("changed_when: false") + 1    # + the PID 1 stat


# A unit with the export's drop-in; `systemd-analyze verify` must read the
# drop-in (a deliberately wrong one is reported) and find nothing in ours.
UNIT = "[Unit]\nDescription=proxytune test unit\n[Service]\nExecStart=/bin/true\n"


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_systemd_dropin_passes_systemd_analyze_verify(tmp_path, cli):
    text = cli("tune", "export", "--format", "systemd", "--only", "service:*", "--service", "pttest").output
    dropin = text.split("# /etc/systemd/system/pttest.service.d/50-proxytune.conf\n", 1)[1]
    (tmp_path / "pttest.service.d").mkdir()
    (tmp_path / "pttest.service").write_text(UNIT)
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"}

    def verify(content):
        (tmp_path / "pttest.service.d/50-proxytune.conf").write_text(content)
        return subprocess.run(["systemd-analyze", "verify", "pttest.service"], capture_output=True, text=True,
                              env=env, timeout=60)
    control = verify("[Service]\nLimitNOFILE=lots\n")
    assert "50-proxytune.conf" in control.stderr           # the drop-in is read: a bad one is named
    r = verify(dropin)
    assert r.returncode == 0 and "50-proxytune.conf" not in r.stderr, r.stderr
    assert "LimitNOFILE=65536" in dropin


LIMITS_PROFILE = """[profile]
description = "limits.d test: below this machine's hard nofile cap"
os = "linux"

[limits."proxy:nofile"]
at_least = 16384
reason = "test"
source = "test"
"""


@needs_root
def test_limits_d_is_applied_by_pam_limits_at_login(tmp_path, cli):
    """runuser -l goes through PAM (session pam_limits); a private
    /etc/security/limits.d in a mount namespace holds only the export."""
    if subprocess.run(["id", "proxy"], capture_output=True).returncode != 0:
        pytest.skip("no user 'proxy' here")
    prof = tmp_path / "limits.toml"
    prof.write_text(LIMITS_PROFILE)
    (tmp_path / "limits.d").mkdir()
    r = cli("tune", "export", "--format", "limits.d", "-p", str(prof), "-o", str(tmp_path / "limits.d/90-proxytune.conf"))
    assert r.exit_code == 0, r.output
    script = (f"mount --bind {tmp_path}/limits.d /etc/security/limits.d && "
              "runuser -l proxy -s /bin/sh -c 'ulimit -Sn; ulimit -Hn'")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["16384", "16384"]


def test_tuned_profile_directory_follows_the_installed_version():
    from proxytune.tune.export_host import tuned_profile_dir
    assert tuned_profile_dir((2, 20, 0)) == "/etc/tuned/proxytune"
    assert tuned_profile_dir((2, 24, 0)) == "/etc/tuned/profiles/proxytune"
    assert tuned_profile_dir((3, 0)) == "/etc/tuned/profiles/proxytune"
    assert tuned_profile_dir(None) == "/etc/tuned/proxytune"


def test_tuned_include_must_be_a_profile_name(cli):
    r = cli("tune", "export", "--format", "tuned", "--tuned-include", "x\n[sysctl]\nkernel.panic=1")
    assert r.exit_code == 2 and "not a tuned profile name" in r.output

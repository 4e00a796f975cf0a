"""Round trips on real kernel state, each in a sandbox the test makes:
apply changes the knob, rollback restores every value exactly.

- net.* sysctls inside a fresh network namespace (unshare -n)
- noatime on a loop-mounted ext4 image, with its fstab entry under a temp root
- RLIMIT_NOFILE of a process the test spawns
- a systemd drop-in written under a temporary root
"""

import json
import shutil
import subprocess
import time

import pytest

from conftest import IS_ROOT, in_netns, needs_root, proxytune, wait_exec

NET_KEYS = ["net/ipv4/ip_local_port_range", "net/ipv4/tcp_max_syn_backlog", "net/core/somaxconn",
            "net/ipv4/tcp_tw_reuse", "net/ipv4/tcp_fin_timeout", "net/ipv4/tcp_syncookies"]
DUMP = "for k in " + " ".join(NET_KEYS) + "; do printf '%s=%s\\n' $k \"$(cat /proc/sys/$k)\"; done"


def parse_dump(text):
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@needs_root
def test_net_sysctls_in_netns_apply_then_rollback_exactly(sandbox):
    script = f"""
{DUMP} > $OUT/before
$PT tune apply --only 'sysctl:net.*' --persist --yes --json > $OUT/apply.json
{DUMP} > $OUT/applied
$PT tune apply --only 'sysctl:net.*' --persist --yes --json > $OUT/again.json
$PT tune rollback --yes --json > $OUT/rollback.json
{DUMP} > $OUT/after
"""
    out = sandbox.root.parent
    r = in_netns(script, env={"OUT": str(out)})
    assert r.returncode == 0, r.stderr
    before, applied, after = (parse_dump((out / n).read_text()) for n in ("before", "applied", "after"))
    assert before == after, "rollback did not restore every value exactly"
    assert applied["net/ipv4/ip_local_port_range"].split() == ["1024", "65535"]
    assert int(applied["net/core/somaxconn"]) >= 8192
    assert int(applied["net/ipv4/tcp_fin_timeout"]) <= 30
    assert applied["net/ipv4/tcp_tw_reuse"] == "1"
    verify = json.loads((out / "apply.json").read_text())["data"]["verify"]
    statuses = {s["setting"]: s["status"] for s in verify["settings"]}
    # not in a non-initial network namespace: reported, and the rest went on
    assert statuses.pop("sysctl:net.core.netdev_max_backlog") == "n/a"
    assert set(statuses.values()) == {"met"}
    again = json.loads((out / "again.json").read_text())["data"]
    assert again["journal"] is None and again["steps"] == [], "second apply changed something"
    assert not (sandbox.root / "etc/sysctl.d/90-proxytune.conf").exists(), "persisted file not removed"


@needs_root
def test_at_least_and_at_most_never_move_a_knob_the_wrong_way(sandbox):
    script = """
echo 100000 > /proc/sys/net/core/somaxconn
echo 10 > /proc/sys/net/ipv4/tcp_fin_timeout
echo 2048 > /proc/sys/net/ipv4/tcp_max_syn_backlog
$PT tune apply --only 'sysctl:net.core.somaxconn' --only 'sysctl:net.ipv4.tcp_fin_timeout' \\
    --only 'sysctl:net.ipv4.tcp_max_syn_backlog' --yes >/dev/null
cat /proc/sys/net/core/somaxconn /proc/sys/net/ipv4/tcp_fin_timeout /proc/sys/net/ipv4/tcp_max_syn_backlog
"""
    r = in_netns(script)
    assert r.returncode == 0, r.stderr
    # somaxconn stays above 8192, fin_timeout stays below 30, the syn backlog is raised
    assert r.stdout.split() == ["100000", "10", "8192"]


@needs_root
def test_noatime_remount_of_loop_ext4_and_fstab(sandbox, loop_ext4):
    img, mnt = loop_ext4
    (mnt / "spool").mkdir()
    fstab = sandbox.root / "etc/fstab"
    original = f"# fstab\nUUID=x / ext4 errors=remount-ro 0 1\n{img}\t{mnt}  ext4  defaults,relatime,nodev 0 2\n"
    fstab.write_text(original)

    def options():
        return subprocess.run(["findmnt", "-n", "-o", "OPTIONS", str(mnt)], capture_output=True,
                              text=True).stdout.strip().split(",")
    assert "relatime" in options()
    r = proxytune("tune", "apply", "--only", "mount:*", "--cache-dir", str(mnt / "spool"), "--persist", "--yes")
    assert r.returncode == 0, r.stderr
    assert "noatime" in options()
    assert f"{mnt}  ext4  defaults,nodev,noatime 0 2" in fstab.read_text()
    assert (sandbox.root / "etc/fstab.proxytune.bak").read_text() == original
    r = proxytune("tune", "rollback", "--yes")
    assert r.returncode == 0, r.stderr
    assert "relatime" in options() and "noatime" not in options()
    assert fstab.read_text() == original
    assert not (sandbox.root / "etc/fstab.proxytune.bak").exists()


@needs_root
def test_rlimit_nofile_of_a_spawned_process(sandbox, tmp_path):
    exe = tmp_path / "ptproxytest"
    shutil.copy("/bin/sleep", exe)
    proc = subprocess.Popen(["prlimit", "--nofile=1024:4096", str(exe), "60"])
    try:
        wait_exec(proc, exe.name)
        import resource
        before = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)
        assert before == (1024, 4096)
        # within the hard limit: allowed without CAP_SYS_RESOURCE
        live = {"PROXYTUNE_ROOT": "/"}      # running processes are read on the live host, never under --root
        r = proxytune("tune", "apply", "-p", "linux/squid-2000", "--service", exe.name, "--only", "rlimit:*", "--yes",
                      env=live)
        if r.returncode == 2 and "CAP_SYS_RESOURCE" in r.stderr:
            # 8192 exceeds the hard 4096: raising it needs the capability; apply refused before changing
            assert resource.prlimit(proc.pid, resource.RLIMIT_NOFILE) == before
            r = proxytune("tune", "apply", "-p", str(_profile(tmp_path, 4000)), "--service", exe.name, "--yes", env=live)
        assert r.returncode == 0, r.stderr
        soft, hard = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)
        assert soft >= 4000 and hard >= 4096
        r = proxytune("tune", "rollback", "--yes", env=live)
        assert r.returncode == 0, r.stderr
        assert resource.prlimit(proc.pid, resource.RLIMIT_NOFILE) == before
    finally:
        proc.kill()
        proc.wait()


def _profile(tmp_path, n):
    p = tmp_path / "nofile.toml"
    p.write_text(f'[profile]\nos = "linux"\n[rlimit."{{service}}:nofile"]\nat_least = {n}\nreason = "t"\nsource = "t"\n')
    return p


def _squid_unit(sandbox, override: str | None):
    unit_dir = sandbox.root / "lib/systemd/system"
    unit_dir.mkdir(parents=True)
    (unit_dir / "squid.service").write_text("[Service]\nExecStart=/usr/sbin/squid\nLimitNOFILE=4096\n")
    dropins = sandbox.root / "etc/systemd/system/squid.service.d"
    dropins.mkdir(parents=True)
    if override is not None:
        (dropins / "override.conf").write_text(override)
    return dropins


def _service_check(*extra):
    r = proxytune("tune", "check", "--service", "squid", "--only", "service:*", "--json", *extra)
    return json.loads(r.stdout)["data"]["settings"][0]


def test_systemd_dropin_under_temporary_root(sandbox):
    dropins = _squid_unit(sandbox, None)
    assert (_service_check()["current"], _service_check()["status"]) == (4096, "drift")
    r = proxytune("tune", "apply", "--service", "squid", "--only", "service:*", "--yes")
    assert r.returncode == 0, r.stderr
    dropin = dropins / "50-proxytune.conf"
    assert "LimitNOFILE=65536" in dropin.read_text()
    assert _service_check()["status"] == "met"
    r = proxytune("tune", "rollback", "--yes")
    assert r.returncode == 0, r.stderr
    assert list(dropins.iterdir()) == []


def test_the_admins_override_conf_wins_over_ours_and_check_names_it(sandbox):
    """`systemctl edit` writes override.conf; it sorts after 50-proxytune.conf, so its value is the one
    systemd uses: a failing one is drift that names override.conf, before and after an apply."""
    dropins = _squid_unit(sandbox, "[Service]\nLimitNOFILE=16384\n")
    override = dropins / "override.conf"
    expected = f"overridden at service start by {override}:2, which sorts after 50-proxytune.conf"
    row = _service_check()
    assert (row["current"], row["status"], row["boot_override"]) == (16384, "drift", expected)
    table = proxytune("--format", "tsv", "tune", "check", "--service", "squid", "--only", "service:*")
    assert f"service:squid:LimitNOFILE\t16384\t>= 65536\tdrift\t{expected}" in table.stdout
    r = proxytune("tune", "apply", "--service", "squid", "--only", "service:*", "--yes")
    assert r.returncode == 1 and f"service:squid:LimitNOFILE: {expected}" in r.stderr, r.stderr
    assert "LimitNOFILE=65536" in (dropins / "50-proxytune.conf").read_text()
    row = _service_check()
    assert (row["current"], row["status"], row["boot_override"]) == (16384, "drift", expected)
    override.write_text("[Service]\nLimitNOFILE=131072\n")       # the admin's own value meets the profile
    assert (_service_check()["status"], _service_check()["boot_override"]) == ("met", None)
    assert proxytune("tune", "rollback", "--yes").returncode == 0
    assert sorted(p.name for p in dropins.iterdir()) == ["override.conf"]
    assert override.read_text() == "[Service]\nLimitNOFILE=131072\n"


def test_rollback_removes_a_dropin_written_under_the_old_name(sandbox, monkeypatch, cli, tmp_path):
    """A host applied by an earlier proxytune has squid.service.d/proxytune.conf (after override.conf) and
    a journal entry naming it: this version still reads it, names it when it shadows ours, rolls it back."""
    from proxytune.tune.backends import systemd
    dropins = _squid_unit(sandbox, "[Service]\nLimitNOFILE=16384\n")
    with monkeypatch.context() as old_version:
        old_version.setattr(systemd, "DROPIN_NAME", "proxytune.conf")
        assert cli("tune", "apply", "--service", "squid", "--only", "service:*", "--yes").exit_code == 0
    legacy = dropins / "proxytune.conf"
    entry = json.loads(proxytune("tune", "history", "--json").stdout)["data"]["entries"][-1]
    steps = json.loads(next((sandbox.state_dir / "journal").glob(f"{entry['id']}.json")).read_text())["steps"]
    assert [s["path"] for s in steps] == [str(legacy)]
    assert _service_check()["status"] == "met"                  # the old name still sorts after override.conf
    more = tmp_path / "more.toml"                               # a profile that asks for more: ours would not win
    more.write_text('[profile]\nos = "linux"\n[service."squid:LimitNOFILE"]\nat_least = 70000\nreason = "t"\n'
                    'source = "t"\n')
    row = _service_check("-p", str(more))
    assert row["status"] == "drift" and row["boot_override"] == (
        f"overridden at service start by {legacy}:3, which sorts after 50-proxytune.conf")
    r = proxytune("tune", "rollback", "--yes")
    assert r.returncode == 0, r.stderr
    assert not legacy.exists() and sorted(p.name for p in dropins.iterdir()) == ["override.conf"]
    assert _service_check()["current"] == 16384


def test_limits_d_round_trip(sandbox):
    limits = sandbox.root / "etc/security/limits.conf"
    limits.parent.mkdir(parents=True)
    limits.write_text("# default\n*  soft  core  0\n")
    r = proxytune("tune", "apply", "--user", "proxy", "--only", "limits:*", "--yes", "--json")
    assert r.returncode == 0, r.stderr
    written = (sandbox.root / "etc/security/limits.d/90-proxytune.conf").read_text()
    assert "proxy\tsoft\tnofile\t65536" in written and "proxy\thard\tnofile\t65536" in written
    assert proxytune("tune", "rollback", "--yes").returncode == 0
    assert not (sandbox.root / "etc/security/limits.d/90-proxytune.conf").exists()
    assert limits.read_text() == "# default\n*  soft  core  0\n"

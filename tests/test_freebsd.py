"""FreeBSD profile: plan, apply --persist and rollback through the command
runner, and the files written compared against expected files that were
checked by hand against sysctl.conf(5), loader.conf(5), login.conf(5), fstab(5)."""

import shutil
from pathlib import Path

import pytest

from freebsd_runner import FreeBSDCommands
from proxytune.tune import apply as apply_mod, export, params, plan as plan_mod, profile
from proxytune.tune.host import Host

FIXTURES = Path(__file__).parent / "fixtures/freebsd"
SYSCTLS = {
    "kern.maxfiles": "32768", "kern.maxfilesperproc": "29491", "kern.ipc.soacceptqueue": "128",
    "net.inet.ip.portrange.first": "10000", "net.inet.ip.portrange.last": "65535",
    "kern.ipc.nmbclusters": "30000", "vfs.aio.max_aio_procs": "32", "vfs.aio.max_aio_queue": "1024",
    "vfs.aio.max_aio_queue_per_proc": "256",
}
MOUNTS = [("/dev/ada0p2", "/", "ufs", "rw"), ("/dev/ada1p1", "/var/squid", "ufs", "rw")]
FILES = ["etc/sysctl.conf", "boot/loader.conf", "etc/login.conf", "etc/fstab"]


@pytest.fixture
def bsd(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "root", root)
    host = Host(root=root, state_dir=tmp_path / "state", runner=FreeBSDCommands(SYSCTLS, MOUNTS), os="freebsd")
    return host


def build(host):
    return plan_mod.build("freebsd/proxy", host, {"cache_dirs": ["/var/squid/cache"]})


def test_plan_reads_through_the_runner(bsd):
    plan = build(bsd)
    status = {c.setting.address: (c.status, c.target) for c in plan.changes}
    assert status["sysctl:kern.maxfiles"] == ("drift", 262144)
    assert status["sysctl:net.inet.ip.portrange.first"] == ("drift", 1024)
    assert status["sysctl:net.inet.ip.portrange.last"][0] == "met"
    assert status["loader:kern.ipc.nmbclusters"] == ("drift", 262144)   # loader.conf says 30000
    assert status["login:daemon:openfiles"] == ("drift", 65536)          # openfiles-cur=1024
    assert status["mount:/var/squid/cache:noatime"] == ("drift", True)
    assert plan.count("error") == 0


@pytest.mark.host  # apply needs root; runs the fake host's programs (the tier: tests/tiers.py)
def test_apply_persist_writes_expected_files_and_rollback_restores(bsd):
    originals = {f: (bsd.root / f).read_text() for f in FILES}
    outcome = apply_mod.apply_plan(build(bsd), bsd, persist=True)
    runner = bsd.runner
    assert runner.sysctls["kern.maxfiles"] == "262144"
    assert runner.sysctls["net.inet.ip.portrange.first"] == "1024"
    assert runner.sysctls["kern.ipc.nmbclusters"] == "30000"     # boot-time: only loader.conf changes
    assert ["mount", "-u", "-o", "noatime", "/var/squid"] in runner.history
    assert ["cap_mkdb", str(bsd.root / "etc/login.conf")] in runner.history
    for f in FILES:
        expected = (FIXTURES / "expected" / Path(f).name).read_text()
        assert (bsd.root / f).read_text() == expected, f
    assert build(bsd).count("drift") == 0
    assert any("next boot" in n for n in outcome.notes)

    apply_mod.rollback(bsd)
    assert runner.sysctls == SYSCTLS
    assert runner.mounts == [list(m) for m in MOUNTS]
    for f in FILES:
        assert (bsd.root / f).read_text() == originals[f], f
    assert not (bsd.root / "etc/fstab.proxytune.bak").exists()


def test_export_freebsd_matches_expected():
    prof = profile.load("freebsd/proxy")
    host = Host(os="freebsd")
    values, _ = params.resolve(host, {"cache_dirs": ["/var/squid/cache"]}, prof.params)
    settings, _ = profile.expand(prof, values, host)
    text = export.export("freebsd", settings, "freebsd/proxy", "freebsd")
    assert text == (FIXTURES / "expected/export-freebsd.txt").read_text()


def test_linux_formats_refuse_a_freebsd_profile():
    from proxytune.core.errors import ProxytuneError
    with pytest.raises(ProxytuneError, match="is for Linux profiles") as e:
        export.export("sysctl.d", [], "freebsd/proxy", "freebsd")
    assert e.value.hint == "use --format freebsd"

"""Profiles travel as the controller resolved them (issue 27, item 2).

`fleet -p NAME` sent only the name: a site or user profile of that name (a
tired operator's override of linux/proxy with its waivers, or site/edge that
only the controller has) was replaced on every host by the shipped profile of
that name, or failed there; a file's includes were looked up again on each host.
Now a name that resolves to a site or user file, and every file, is bundled
flattened: its includes merged, its waivers kept, one self-contained profile.
"""

import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from conftest import REPO, needs_root

BASE = """[profile]
description = "site base"
os = "linux"

[sysctl."net.core.somaxconn"]
at_least = 8192
reason = "listen backlog"
source = "listen(2)"

[sysctl."net.ipv4.tcp_fin_timeout"]
at_most = 30
reason = "FIN-WAIT-2"
source = "ip-sysctl.rst"
"""
EDGE = """[profile]
description = "the edge: its own base, one waiver"
os = "linux"
include = [{include}]

[sysctl."net.core.somaxconn"]
at_least = 16384
reason = "edge bursts"
source = "CHG-1"
waive = "CHG-2: the edge's LB limits it"

[sysctl."net.ipv4.ip_local_port_range"]
covers = [1024, 65535]
reason = "ephemeral ports"
source = "ip-sysctl.rst"
critical = true
"""


def write_catalog(config: Path) -> Path:
    """The operator's own profiles in CONFIG/proxytune/profiles: site/base, site/edge (including it,
    with a waiver) and an override of the shipped linux/proxy (the same)."""
    d = config / "proxytune/profiles"
    (d / "site").mkdir(parents=True)
    (d / "linux").mkdir(parents=True)
    (d / "site/base.toml").write_text(BASE)
    (d / "site/edge.toml").write_text(EDGE.format(include='"site/base"'))
    (d / "linux/proxy.toml").write_text(EDGE.format(include='"site/base"').replace("the edge", "override"))
    return d


@pytest.fixture
def user_catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return write_catalog(tmp_path / "config")


def shape(prof) -> list:
    return sorted((r.backend, r.key, r.mode, r.wanted, r.reason, r.source, r.waive, r.critical) for r in prof.raw)


def prepared(tmp_path, monkeypatch, ref):
    from proxytune.tune import fleet, fleet_inventory
    inv = tmp_path / "hosts.ini"
    inv.write_text("h1\n")
    monkeypatch.setattr(fleet_inventory, "hosts", lambda *a: ["h1"])      # no ansible-inventory needed here
    f = fleet.Fleet(str(inv), ref, progress=lambda *a: None)
    f.__enter__()
    try:
        f.prepare()
        out = tmp_path / "host-side"
        with tarfile.open(f.tarball) as tar:
            names = tar.getnames()
            tar.extractall(out, filter="data")
        return f.host_profile(), names, out
    finally:
        f.__exit__(None, None, None)


@pytest.mark.host  # the fleet bundle lists a checkout's files with git ls-files
@pytest.mark.parametrize("ref", ["site/edge", "linux/proxy"])
def test_a_name_that_resolves_to_a_user_profile_travels_flattened_with_its_waivers(tmp_path, monkeypatch,
                                                                                 user_catalog, ref):
    """site/edge exists only on the controller; linux/proxy is the operator's override of the shipped one."""
    from proxytune.tune import fleet_play, profile
    want = shape(profile.load(ref))
    sent, names, host_side = prepared(tmp_path, monkeypatch, ref)
    assert fleet_play.PROFILE_IN_BUNDLE in names, names
    assert sent.endswith("/" + fleet_play.PROFILE_IN_BUNDLE), sent
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "host-has-no-catalog"))
    got = profile.load(str(host_side / fleet_play.PROFILE_IN_BUNDLE))
    assert shape(got) == want
    assert any(w for *_, w, _ in want)          # the waiver made the trip


@pytest.mark.host  # the fleet bundle lists a checkout's files with git ls-files
def test_a_profile_file_whose_include_is_relative_travels_whole(tmp_path, monkeypatch):
    """-p ./edge.toml including ./base.toml: only edge.toml was bundled, its include failed on the host."""
    from proxytune.tune import fleet_play, profile
    (tmp_path / "base.toml").write_text(BASE)
    (tmp_path / "edge.toml").write_text(EDGE.format(include='"./base.toml"'))
    ref = str(tmp_path / "edge.toml")
    want = shape(profile.load(ref))
    sent, names, host_side = prepared(tmp_path, monkeypatch, ref)
    got = profile.load(str(host_side / fleet_play.PROFILE_IN_BUNDLE))
    assert shape(got) == want


# ---------------------------------------------------------------- over real hosts

needs_ansible = pytest.mark.skipif(not (shutil.which("ansible-playbook") and os.path.exists("/usr/sbin/sshd")),
                                   reason="needs ansible-playbook and openssh-server")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    from fleet_hosts import namespace_hosts
    d = tmp_path_factory.mktemp("fleetprofiles")
    with namespace_hosts(d, {"pfa": {"net.core.somaxconn": "4096"}, "pfb": {}}) as fh:
        yield fh


@needs_root
@needs_ansible
def test_every_host_checks_the_operators_override_with_its_waiver(hosts, tmp_path):
    import subprocess
    write_catalog(tmp_path / "config")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "PROXYTUNE_STATE_DIR": str(hosts["dir"] / "controller-state"), "ANSIBLE_HOME": str(hosts["dir"] / "ah"),
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(hosts["dir"] / "cp"), "ANSIBLE_TIMEOUT": "60"}
    r = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "fleet", "check", "-i",
                        str(hosts["dir"] / "hosts.ini"), "-p", "linux/proxy", "--json"], capture_output=True,
                       text=True, env=env, timeout=300)
    data = json.loads(r.stdout)["data"]
    for h in ("pfa", "pfb"):
        row = data["hosts"][h]
        assert row["status"] == "ok", row.get("error")
        status = {s["setting"]: s["status"] for s in row["settings"]}
        assert set(status) == {"sysctl:net.core.somaxconn", "sysctl:net.ipv4.tcp_fin_timeout",
                               "sysctl:net.ipv4.ip_local_port_range"}, status
        assert status["sysctl:net.core.somaxconn"] == "waived", status


# ---------------------------------------------------------------- second attack round

TRICKY = """[profile]
description = "quotes \\" backslash \\\\ triple ''' hash # unicode \u00e9\u2014 tab-free"
os = "linux"
include = ["shipped:linux/proxy"]

[params]
service = "squid"
cache_dirs = ["/var/spool/squid", "/cache/two"]

[sysctl."net.core.somaxconn"]
at_least = 8192
reason = "a reason with \\"quotes\\", a \\\\ and ''' and # and \u00e9"
source = "https://example.org/a#b?c=\\"d\\""
waive = "CHG-3: \\"not\\" here \\\\ ok"

[mount."{cache_dir}:noatime"]
value = true
reason = "r"
source = "s"
critical = true
"""


@pytest.mark.host  # the fleet bundle lists a checkout's files with git ls-files
def test_an_override_extending_the_shipped_profile_with_text_toml_must_escape_travels_exactly(tmp_path, monkeypatch):
    """The site's linux/squid extends shipped:linux/proxy, sets [params] (a list), and carries text with
    quotes, backslashes, ''' and non-ASCII: the flat copy must parse back to the very same profile."""
    from proxytune.tune import fleet_play, profile
    d = tmp_path / "config/proxytune/profiles/linux"
    d.mkdir(parents=True)
    (d / "squid.toml").write_text(TRICKY)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    want = profile.load("linux/squid")
    sent, names, host_side = prepared(tmp_path, monkeypatch, "linux/squid")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "host-has-no-catalog"))
    got = profile.load(str(host_side / fleet_play.PROFILE_IN_BUNDLE))
    assert shape(got) == shape(want) and got.params == want.params and got.description == want.description
    assert len(want.raw) > 10          # the shipped settings came along


@pytest.mark.host  # the fleet bundle lists a checkout's files with git ls-files
def test_a_shipped_name_still_travels_as_a_name(tmp_path, monkeypatch):
    """Nothing to flatten: the bundle carries the same shipped profiles."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "empty"))
    sent, names, _ = prepared(tmp_path, monkeypatch, "linux/squid")
    assert sent == "linux/squid" and "fleet-profile.toml" not in names

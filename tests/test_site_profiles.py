"""Site and user profiles: /etc/proxytune/profiles (under --root) and
$XDG_CONFIG_HOME/proxytune/profiles are searched before the shipped ones,
and `profiles list` says where each comes from."""

import json
import os

from conftest import proxytune

SITE = """[profile]
description = "{what}"
os = "linux"
include = ["linux/proxy"]

[sysctl."net.core.somaxconn"]
at_least = {somaxconn}
reason = "site rule"
source = "ops wiki"
"""


def write(directory, name, what, somaxconn=16384):
    path = directory / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SITE.format(what=what, somaxconn=somaxconn))
    return path


def listing(sandbox, env):
    r = proxytune("--root", str(sandbox.root), "profiles", "list", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return {row["name"]: row for row in json.loads(r.stdout)["data"]["profiles"]}, r.stderr


def test_site_then_user_then_shipped(sandbox, tmp_path):
    config = tmp_path / "config"
    site_dir = sandbox.root / "etc/proxytune/profiles"
    write(site_dir, "site/edge", "the site's edge proxies")
    write(site_dir, "linux/proxy-strict", "site strict")
    write(config / "proxytune/profiles", "linux/proxy-strict", "user strict (hidden by the site's)")
    write(config / "proxytune/profiles", "mine", "a user's own")
    rows, _ = listing(sandbox, {"XDG_CONFIG_HOME": str(config)})
    assert rows["site/edge"]["source"] == "site" and rows["site/edge"]["path"].startswith(str(site_dir))
    assert rows["linux/proxy-strict"]["description"] == "site strict"
    assert rows["mine"]["source"] == "user"
    assert rows["linux/proxy"]["source"] == "shipped"
    # a site profile is usable by name, and its include of a shipped profile resolves
    r = proxytune("--root", str(sandbox.root), "profiles", "show", "site/edge", "--json",
                  env={"XDG_CONFIG_HOME": str(config)})
    assert r.returncode == 0, r.stderr
    settings = {s["setting"]: s for s in json.loads(r.stdout)["data"]["settings"]}
    assert settings["sysctl:net.core.somaxconn"]["reason"] == "site rule"
    assert "sysctl:fs.nr_open" in settings


def test_a_site_profile_hides_the_shipped_one_of_its_name(sandbox, tmp_path):
    write(sandbox.root / "etc/proxytune/profiles", "linux/squid", "our squid", somaxconn=12345)
    rows, _ = listing(sandbox, {"XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert rows["linux/squid"]["source"] == "site"
    r = proxytune("--root", str(sandbox.root), "tune", "check", "--profile", "linux/squid", "--json")
    settings = {s["setting"]: s for s in json.loads(r.stdout)["data"]["settings"]}
    assert settings["sysctl:net.core.somaxconn"]["wanted_text"] == ">= 12345"


def test_a_directory_others_can_write_is_ignored_and_named(sandbox, tmp_path):
    config = tmp_path / "config"
    planted = write(config / "proxytune/profiles", "linux/proxy", "planted by someone else", somaxconn=1)
    os.chmod(planted.parent.parent, 0o777)
    rows, err = listing(sandbox, {"XDG_CONFIG_HOME": str(config)})
    assert rows["linux/proxy"]["source"] == "shipped"
    assert "ignored" in err and "writable by others" in err


def test_a_profile_file_others_can_write_or_a_symlink_out_is_ignored(sandbox, tmp_path):
    site_dir = sandbox.root / "etc/proxytune/profiles"
    writable = write(site_dir, "site/loose", "anyone may edit this")
    os.chmod(writable, 0o666)
    outside = write(tmp_path / "public", "planted", "reached through a symlink")
    os.chmod(outside.parent, 0o777)
    (site_dir / "site/link.toml").symlink_to(outside)
    write(site_dir, "site/fine", "a good one")
    rows, err = listing(sandbox, {"XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert "site/fine" in rows and "site/loose" not in rows and "site/link" not in rows
    assert f"ignored {writable}" in err and "site/link.toml" in err


def test_piped_list_has_a_source_column(sandbox, tmp_path):
    write(sandbox.root / "etc/proxytune/profiles", "site/edge", "edge")
    r = proxytune("--root", str(sandbox.root), "profiles", "list", env={"XDG_CONFIG_HOME": str(tmp_path / "none")})
    rows = [l.split("\t") for l in r.stdout.splitlines() if "\t" in l]
    assert rows[0] == ["name", "source", "os", "settings", "description"]
    assert ["site/edge", "site", "linux", "14", "edge"] in rows


# ---------------------------------------------------------------- customisation (issue 19 item 7)

def test_a_broken_site_profile_is_skipped_with_a_warning_not_fatal_to_the_list(sandbox, tmp_path):
    site_dir = sandbox.root / "etc/proxytune/profiles"
    write(site_dir, "site/fine", "a good one")
    (site_dir / "site/broken.toml").write_text('[profile\nos = "linux"\n')
    (site_dir / "site/bad-value.toml").write_text(SITE.format(what="bad", somaxconn=1) + "[sysctls.x]\n")
    rows, err = listing(sandbox, {"XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert "site/fine" in rows and "linux/proxy" in rows
    assert "site/broken" not in rows and "site/bad-value" not in rows
    assert "warning: skipped site/broken (site):" in err and "TOML syntax error" in err
    assert "warning: skipped site/bad-value (site):" in err and "unknown backend" in err


EXTENDS = """[profile]
description = "our proxy: the shipped one, plus"
os = "linux"
include = ["{include}"]

[sysctl."net.core.somaxconn"]
at_least = 20000
reason = "site rule"
source = "ops wiki"
"""


def test_a_site_profile_extends_the_shipped_profile_of_its_own_name(sandbox, tmp_path):
    site_dir = sandbox.root / "etc/proxytune/profiles/linux"
    site_dir.mkdir(parents=True)
    (site_dir / "proxy.toml").write_text(EXTENDS.format(include="shipped:linux/proxy"))
    env = {"XDG_CONFIG_HOME": str(tmp_path / "none")}
    r = proxytune("--root", str(sandbox.root), "profiles", "show", "linux/proxy", "--json", env=env)
    assert r.returncode == 0, r.stderr
    settings = {s["setting"]: s for s in json.loads(r.stdout)["data"]["settings"]}
    assert settings["sysctl:net.core.somaxconn"]["wanted"] == 20000 and "sysctl:fs.nr_open" in settings
    # linux/squid includes linux/proxy: now the site's, which extends the shipped one
    r = proxytune("--root", str(sandbox.root), "profiles", "show", "linux/squid", "--json", env=env)
    squid = {s["setting"]: s for s in json.loads(r.stdout)["data"]["settings"]}
    assert squid["sysctl:net.core.somaxconn"]["wanted"] == 20000 and "sysctl:fs.nr_open" in squid
    # including its own name is a loop, and the line says how to extend instead
    (site_dir / "proxy.toml").write_text(EXTENDS.format(include="linux/proxy"))
    r = proxytune("--root", str(sandbox.root), "profiles", "show", "linux/proxy", env=env)
    assert r.returncode == 2 and "include loop" in r.stderr and 'include "shipped:NAME"' in r.stderr
    for bad in ("shipped:no/such", "shipped:../linux/proxy"):
        (site_dir / "proxy.toml").write_text(EXTENDS.format(include=bad))
        r = proxytune("--root", str(sandbox.root), "profiles", "show", "linux/proxy", env=env)
        assert r.returncode == 2 and "no such shipped profile" in r.stderr, r.stderr


WAIVED = """[profile]
os = "linux"
description = "waives one setting"

[sysctl."net.core.somaxconn"]
reason = "would drift on any host"
source = "test"
at_least = 2147483647
waive = "CHG-1234: the load balancer caps connections"

[sysctl."fs.aio-max-nr"]
at_least = 2147483647
reason = "drifts, not waived"
source = "test"
"""


def test_a_waived_setting_is_reported_waived_with_its_reason_never_drift_never_applied(sandbox, tmp_path):
    prof = tmp_path / "waived.toml"
    prof.write_text(WAIVED)
    r = proxytune("--root", str(sandbox.root), "tune", "check", "-p", str(prof), "--json")
    doc = json.loads(r.stdout)["data"]
    by = {s["setting"]: s for s in doc["settings"]}
    waived = by["sysctl:net.core.somaxconn"]
    assert waived["status"] == "waived" and "CHG-1234: the load balancer caps connections" in waived["note"]
    assert waived["current"] is not None and waived["target"] is None
    assert by["sysctl:fs.aio-max-nr"]["status"] == "drift"
    assert doc["summary"]["waived"] == 1 and doc["summary"]["drift"] == 1 and r.returncode == 1
    # only the waived one: nothing to do, exit 0
    r = proxytune("--root", str(sandbox.root), "tune", "check", "-p", str(prof), "--only", "sysctl:net.core.*")
    assert r.returncode == 0 and "waived" in r.stdout + r.stderr
    r = proxytune("--root", str(sandbox.root), "tune", "plan", "-p", str(prof), "--json")
    todo = [s["setting"] for s in json.loads(r.stdout)["data"]["settings"] if s["target"] is not None]
    assert todo == ["sysctl:fs.aio-max-nr"]
    prof.write_text(WAIVED.replace('waive = "CHG-1234: the load balancer caps connections"', "waive = true"))
    r = proxytune("--root", str(sandbox.root), "tune", "check", "-p", str(prof))
    assert r.returncode == 2 and f"{prof}:9: sysctl:net.core.somaxconn: waive takes a non-empty text" in r.stderr

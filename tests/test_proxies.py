"""HAProxy, Varnish and Traffic Server as targets: their profiles, the doctor's
reading of each proxy (identity, config, own statistics) and bench proxy
driving each one from Debian's packages."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import IS_ROOT, REPO, proxytune

NEW_PROFILES = {"linux/haproxy": ("haproxy", "haproxy"), "linux/varnish": ("varnish", "vcache"),
                "linux/trafficserver": ("trafficserver", "trafficserver")}


@pytest.mark.parametrize("name", sorted(NEW_PROFILES))
def test_proxy_profile_checks_on_this_host(name, sandbox):
    p = proxytune("tune", "check", "-p", name, "--json")
    assert p.returncode in (0, 1), p.stderr
    doc = json.loads(p.stdout)
    data = doc.get("data", doc)
    service, user = NEW_PROFILES[name]
    assert (data["params"]["values"]["service"], data["params"]["values"]["user"]) == (service, user)
    assert {s["status"] for s in data["settings"]} <= {"met", "drift", "n/a"}, data["settings"]
    shown = json.loads(proxytune("profiles", "show", name, "--json").stdout)
    assert all(s["reason"].strip() and s["source"].strip() for s in shown["settings"])


def test_haproxy_profile_gives_two_fds_per_connection_of_its_maxconn():
    shown = json.loads(proxytune("profiles", "show", "linux/haproxy", "--json").stdout)
    fd = {s["setting"]: s["wanted"] for s in shown["settings"] if s["setting"].endswith(("nofile", "LimitNOFILE"))}
    assert "maxconn 60000" in shown["description"]
    assert len(fd) == 3 and all(v >= 2 * 60000 for v in fd.values()), fd

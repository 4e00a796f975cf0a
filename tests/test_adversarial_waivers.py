"""A waived setting stays waived wherever the profile goes (issue 27, item 3).

A tired operator waives a setting on purpose (`waive = "CHG-7: ..."`): `tune
check` shows it waived and apply leaves it alone. But the limits.d, systemd and
Ansible exports wrote it anyway (the playbook then set the waived value on every
host), the textfile read it as `proxytune_setting_met 0` (an alert), and Nagios
left it out of its counts. Each export is checked as its consumer sees it.
"""

import json
import re
import shutil
import subprocess

import pytest

from conftest import REPO

WAIVED = {"sysctl:net.core.somaxconn": "CHG-7: the load balancer caps the backlog",
          "limits:proxy:nofile": "CHG-8: logins of proxy keep the default",
          "service:squid:LimitNOFILE": "CHG-9: the unit is managed by the vendor",
          "rlimit:squid:nofile": "CHG-10: restarts pick up the unit's limit"}
PROFILE = """[profile]
description = "waivers"
os = "linux"

[sysctl."net.core.somaxconn"]
at_least = 4096
reason = "listen backlog"
source = "listen(2)"
waive = "CHG-7: the load balancer caps the backlog"

[sysctl."fs.file-max"]
at_least = 1048576
reason = "file table"
source = "fs.rst"

[limits."{user}:nofile"]
at_least = 65536
reason = "logins"
source = "limits.conf(5)"
waive = "CHG-8: logins of proxy keep the default"

[service."{service}:LimitNOFILE"]
at_least = 65536
reason = "the unit"
source = "systemd.exec(5)"
waive = "CHG-9: the unit is managed by the vendor"

[rlimit."{service}:nofile"]
at_least = 65536
reason = "running processes"
source = "prlimit(2)"
waive = "CHG-10: restarts pick up the unit's limit"
"""
FREEBSD = """[profile]
description = "waivers"
os = "freebsd"

[sysctl."kern.ipc.somaxconn"]
at_least = 4096
reason = "listen backlog"
source = "listen(2)"
waive = "CHG-11: not on this fleet"

[sysctl."kern.maxfiles"]
at_least = 1048576
reason = "file table"
source = "sysctl(8)"
"""
NAMES = ["squid", "proxy"]


@pytest.fixture
def prof(tmp_path):
    p = tmp_path / "waivers.toml"
    p.write_text(PROFILE)
    return p


def export(cli, prof, fmt):
    r = cli("tune", "export", "--format", fmt, "-p", str(prof), "--service", "squid", "--user", "proxy")
    assert r.exit_code == 0, r.output
    return r.output


def body(text: str) -> str:
    """What the consumer acts on: every line that is not a comment."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


@pytest.mark.host  # the tuned export asks tuned-adm for its version
@pytest.mark.parametrize("fmt", ["sysctl.d", "limits.d", "systemd", "tuned", "ansible"])
def test_every_linux_export_leaves_a_waived_setting_out_and_says_why(sandbox, cli, prof, fmt):
    out = export(cli, prof, fmt)
    live = body(out)
    assert "somaxconn" not in live and "LimitNOFILE" not in live, live
    assert not re.search(r"\bproxy\b.*nofile|nofile.*65536|prlimit", live), live
    for address, why in WAIVED.items():
        assert f"# waived: {address}: {why}" in out, (address, out[:1500])
    if fmt in ("tuned", "ansible"):
        assert "file-max" in live            # the setting that is not waived is still there
    if fmt == "sysctl.d":                    # written, or left out as met here: not as waived
        assert "fs.file-max" in out and "waived: sysctl:fs.file-max" not in out


def test_the_freebsd_export_leaves_a_waived_setting_out(sandbox, cli, tmp_path):
    p = tmp_path / "bsd.toml"
    p.write_text(FREEBSD)
    out = export(cli, p, "freebsd")
    assert "kern.ipc.somaxconn" not in body(out) and "kern.maxfiles" in body(out), out
    assert "# waived: sysctl:kern.ipc.somaxconn: CHG-11: not on this fleet" in out


@pytest.mark.skipif(not shutil.which("ansible-playbook"), reason="needs ansible-playbook")
def test_the_playbook_has_no_task_for_a_waived_setting_as_ansible_lists_them(sandbox, cli, prof, tmp_path):
    """ansible-playbook --list-tasks: what would run on every host."""
    book = tmp_path / "pt.yml"
    book.write_text(export(cli, prof, "ansible"))
    r = subprocess.run(["ansible-playbook", "-i", "localhost,", "--list-tasks", str(book)], capture_output=True,
                       text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "ANSIBLE_HOME": str(tmp_path / "ah"),
                                                    "ANSIBLE_LOCAL_TEMP": str(tmp_path / "at"), "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    tasks = r.stdout
    assert "fs.file-max" in tasks
    for gone in ("somaxconn", "LimitNOFILE", "pam_limits", "proxy:nofile", "on running processes"):
        assert gone not in tasks, tasks


def run_check(prof, *fmt_args):
    return subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "tests/faulty_cli.py"), "tune", "check",
                           "-p", str(prof), "--service", "squid", "--user", "proxy", *fmt_args],
                          capture_output=True, text=True, timeout=120)


def test_the_textfile_gives_a_waived_setting_its_own_series_not_met_0(sandbox, prof):
    r = run_check(prof, "--format", "prometheus")
    assert r.returncode in (0, 1), r.stderr
    met = {m.group(1): m.group(2) for m in re.finditer(r'^proxytune_setting_met\{setting="([^"]+)"[^}]*\} (\d)$',
                                                        r.stdout, re.M)}
    for address in WAIVED:
        assert met.get(address) != "0", (address, r.stdout)
        assert re.search(rf'^proxytune_setting_waived\{{setting="{re.escape(address)}"[^}}]*\}} 1$', r.stdout,
                         re.M), r.stdout


def test_nagios_counts_waived_settings_and_the_counts_add_up(sandbox, prof):
    r = run_check(prof, "--format", "nagios")
    line = r.stdout.strip()
    assert "4 waived" in line, line
    perf = dict(re.findall(r"(\w+)=(\d+)", line.split("|", 1)[1]))
    total = int(re.search(r"met=\d+;;;0;(\d+)", line).group(1))
    assert perf["waived"] == "4", perf
    assert sum(int(perf[k]) for k in ("met", "drift", "na", "error", "waived")) == total == 5, perf


# ---------------------------------------------------------------- second attack round

def test_a_profile_with_every_setting_waived_exports_a_playbook_ansible_accepts(sandbox, cli, tmp_path):
    """Nothing left to do: every format still loads, the playbook has no setting task."""
    p = tmp_path / "all-waived.toml"
    p.write_text(re.sub(r'(source = "fs.rst"\n)', r'\1waive = "CHG-12: all of it"\n', PROFILE))
    for fmt in ("sysctl.d", "limits.d", "systemd", "tuned"):
        out = export(cli, p, fmt)
        assert "# waived: sysctl:fs.file-max: CHG-12: all of it" in out
        assert not re.search(r"^\s*[^#\s\[]", out, re.M) or fmt == "tuned", out
    if not shutil.which("ansible-playbook"):
        return
    book = tmp_path / "pt.yml"
    book.write_text(export(cli, p, "ansible"))
    r = subprocess.run(["ansible-playbook", "-i", "localhost,", "--syntax-check", str(book)], capture_output=True,
                       text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "ANSIBLE_HOME": str(tmp_path / "ah"),
                                                    "ANSIBLE_LOCAL_TEMP": str(tmp_path / "at"), "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr


def test_a_waived_critical_setting_never_pages_and_the_textfile_counts_add_up(sandbox, tmp_path):
    """`critical = true` on a waived setting that is far off: Nagios must not go CRITICAL for it; the
    textfile's counts by status sum to the settings it has."""
    p = tmp_path / "critical.toml"
    p.write_text(PROFILE.replace('waive = "CHG-7: the load balancer caps the backlog"',
                                 'waive = "CHG-7: the load balancer caps the backlog"\ncritical = true')
                 .replace("at_least = 4096", "at_least = 2147483647"))
    r = run_check(p, "--format", "nagios")
    assert not r.stdout.startswith("PROXYTUNE CRITICAL"), r.stdout
    r = run_check(p, "--format", "prometheus")
    counts = [int(n) for n in re.findall(r'^proxytune_settings\{[^}]*\} (\d+)$', r.stdout, re.M)]
    assert sum(counts) == 5, r.stdout

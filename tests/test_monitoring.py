"""Monitoring hand-off, read the way the consumers read it: a Nagios/Icinga plugin
line (state = exit code, perfdata per the Monitoring Plugins development
guidelines) and a node_exporter textfile parsed by the Prometheus client's own
text parser. Every run is the real CLI as a process against this host's kernel,
with profiles whose verdict on this host is known."""

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import IS_ROOT, REPO, proxytune

STATES = {"OK": 0, "WARNING": 1, "CRITICAL": 2, "UNKNOWN": 3}
LINE = re.compile(r"PROXYTUNE (OK|WARNING|CRITICAL|UNKNOWN) - ([^|]*?)(?: \| (.*))?")
PERF_ITEM = re.compile(r"([A-Za-z0-9_.\-]+)=(-?[0-9.]+)([a-zA-Z%]*)((?:;[^;\s]*){0,4})")


def write_profile(path: Path, met=True, drift=True, critical=None) -> str:
    """A profile whose verdict here is known: net.core.somaxconn at least 1 (met), at least one more than
    now (drift; `critical` marks it)."""
    text = '[profile]\ndescription = "monitoring test"\nos = "linux"\n'
    if met:
        text += '\n[sysctl."net.core.somaxconn"]\nat_least = 1\nreason = "r"\nsource = "s"\n'
    if drift:
        text += (f'\n[sysctl."fs.file-max"]\nat_least = {file_max_bigger()}\nreason = "r"\nsource = "s"\n'
                 + (f"critical = {critical}\n" if critical is not None else ""))
    path.write_text(text)
    return str(path)


def file_max_bigger() -> int:
    """More than fs.file-max is now: a drift on this host, whatever it is."""
    return int(Path("/proc/sys/fs/file-max").read_text()) + 1


def plugin(*args) -> tuple[int, str, str, dict]:
    """Run a check as Nagios does: (exit code, state, text, perfdata {label: [value, warn, crit, min, max]})."""
    r = proxytune(*args)
    lines = r.stdout.splitlines()
    assert len(lines) == 1, (r.stdout, r.stderr)
    m = LINE.fullmatch(lines[0])
    assert m, lines[0]
    state, text, perf = m.groups()
    assert r.returncode == STATES[state], (r.returncode, lines[0], r.stderr)
    assert "Traceback" not in r.stderr
    items = {}
    for item in (perf or "").split(" ") if perf else []:
        pm = PERF_ITEM.fullmatch(item)
        assert pm, f"perfdata item {item!r} is not label=value[UOM];warn;crit;min;max"
        label, value, _, rest = pm.groups()
        items[label] = [float(value), *rest.split(";")[1:]]
    return r.returncode, state, text, items


def test_nagios_state_follows_drift_and_what_is_critical(sandbox, tmp_path):
    met_only = write_profile(tmp_path / "met.toml", drift=False)
    assert plugin("tune", "check", "-p", met_only, "--service", "ptmon", "--format", "nagios")[:2] == (0, "OK")

    prof = write_profile(tmp_path / "drift.toml")
    rc, state, text, perf = plugin("tune", "check", "-p", prof, "--service", "ptmon", "--format", "nagios")
    assert (rc, state) == (1, "WARNING") and "sysctl:fs.file-max" in text, text
    summary = json.loads(proxytune("tune", "check", "-p", prof, "--service", "ptmon", "--json").stdout)["data"]["summary"]
    assert (perf["met"][0], perf["drift"][0], perf["na"][0], perf["error"][0]) == \
        (summary["met"], summary["drift"], summary["n/a"], summary["error"]) == (1, 1, 0, 0)
    assert perf["drift"][1:] == ["0", "", "0", "2"]         # warn above 0 drift; min 0, max = the settings
    assert perf["critical"][0] == 0

    # CRITICAL rather than WARNING: by the profile, or by --critical (a non-matching pattern changes nothing)
    marked = write_profile(tmp_path / "crit.toml", critical="true")
    assert plugin("tune", "check", "-p", marked, "--service", "ptmon", "--format", "nagios")[:2] == (2, "CRITICAL")
    unmarked = write_profile(tmp_path / "uncrit.toml", critical="false")
    assert plugin("tune", "check", "-p", unmarked, "--service", "ptmon", "--format", "nagios")[:2] == (1, "WARNING")
    rc, state, text, perf = plugin("tune", "check", "-p", prof, "--service", "ptmon", "--format", "nagios",
                                   "--critical", "sysctl:fs.file-*")
    assert (rc, state, perf["critical"][0]) == (2, "CRITICAL", 1) and "1 critical drift (sysctl:fs.file-max)" in text
    assert plugin("tune", "check", "-p", prof, "--service", "ptmon", "--format", "nagios",
                  "--critical", "sysctl:net.*")[:2] == (1, "WARNING")


@pytest.mark.parametrize("args, said", [
    (["-p", "/nonexistent/ptmon.toml"], "no such file"),
    (["--bogus-option"], "No such option"),
    (["--only"], "requires an argument"),
    (["-p", "BAD"], "critical is true or false"),
    (["-p", "linux/proxy", "--service", "bad;name"], "--service"),
])
def test_an_error_of_proxytune_is_unknown_never_critical(sandbox, tmp_path, args, said):
    bad = tmp_path / "bad.toml"
    bad.write_text('[profile]\ndescription = "t"\nos = "linux"\n[sysctl."fs.nr_open"]\nat_least = 1\n'
                   'reason = "r"\nsource = "s"\ncritical = "yes"\n')
    args = [str(bad) if a == "BAD" else a for a in args]
    rc, state, text, perf = plugin("tune", "check", "--format", "nagios", *args)
    assert (rc, state) == (3, "UNKNOWN") and said in text, text


def test_an_internal_error_is_unknown_too(sandbox, cli, monkeypatch):
    from proxytune.tune import audit

    def broken(*a, **kw):
        raise RuntimeError("a bug")
    monkeypatch.setattr(audit, "build", broken)
    r = cli("tune", "check", "--format", "nagios")
    assert r.exit_code == 3 and r.stdout == "PROXYTUNE UNKNOWN - proxytune could not check: internal error: " \
                                             "RuntimeError: a bug\n", r.stdout


def test_monitoring_options_refuse_to_be_misread(sandbox):
    for args, said in ((["--critical", "sysctl:*"], "--critical only changes --format nagios"),
                       (["--format", "prometheus", "--critical", "x"], "--critical only changes"),
                       (["-o", "/tmp/ptmon-never.prom"], "--output is the textfile of --format prometheus")):
        r = proxytune("tune", "check", *args)
        assert r.returncode == 2 and said in r.stderr and not r.stdout, r.stderr
    assert not Path("/tmp/ptmon-never.prom").exists()


def families(text: str) -> dict:
    """The textfile as Prometheus' own parser reads it: {name: [(labels, value), ...]}."""
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


def test_prometheus_textfile_is_what_the_audit_says(sandbox, tmp_path):
    prof = write_profile(tmp_path / "p.toml")
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    out = textdir / "proxytune.prom"
    before = time.time()
    r = proxytune("tune", "check", "-p", prof, "--service", "ptmon", "--format", "prometheus", "-o", str(out))
    assert r.returncode == 1 and not r.stdout, r.stderr       # drift: exit 1, as `tune check`
    assert os.listdir(textdir) == ["proxytune.prom"] and out.stat().st_mode & 0o777 == 0o644   # no temp file left
    fams = families(out.read_text())
    audit = json.loads(proxytune("tune", "check", "-p", prof, "--service", "ptmon", "--json").stdout)["data"]
    met = {labels["setting"]: value for labels, value in fams["proxytune_setting_met"]}
    assert met == {s["setting"]: float(s["status"] == "met") for s in audit["settings"]} == \
        {"sysctl:net.core.somaxconn": 1.0, "sysctl:fs.file-max": 0.0}
    assert all(labels["profile"] == prof for labels, _ in fams["proxytune_setting_met"])
    counts = {labels["status"]: value for labels, value in fams["proxytune_settings"]}
    assert counts == {k: float(v) for k, v in audit["summary"].items()}
    (labels, stamp), = fams["proxytune_last_run_timestamp_seconds"]
    assert labels == {"command": "check", "profile": prof} and before <= stamp <= time.time()

    out.chmod(0o640)                             # the admin's mode survives the next run (temp + rename)
    assert proxytune("tune", "check", "-p", prof, "--service", "ptmon", "--format", "prometheus",
                     "-o", str(out)).returncode == 1
    assert out.stat().st_mode & 0o777 == 0o640 and os.listdir(textdir) == ["proxytune.prom"]


def test_hostile_label_values_stay_one_sample(sandbox, tmp_path):
    """A profile path with a quote and a backslash, a cache directory with a quote and a backslash:
    each stays one sample whose label reads back exactly (a newline in a profile path is refused
    before any output: no sample at all)."""
    newline = tmp_path / "new\nline"
    newline.mkdir()
    r = proxytune("tune", "check", "-p", write_profile(newline / "p.toml"), "--service", "ptmon",
                  "--format", "prometheus")
    assert r.returncode == 2 and "control character" in r.stderr and r.stdout == "", r.stderr
    where = tmp_path / 'we"ird\\dir'
    where.mkdir()
    prof = write_profile(where / "p.toml")
    cache = tmp_path / 'ca"che\\dir'
    cache.mkdir()
    r = proxytune("tune", "check", "-p", prof, "--service", "ptmon", "--format", "prometheus")
    fams = families(r.stdout)
    assert [labels["profile"] for labels, _ in fams["proxytune_setting_met"]] == [prof, prof]
    samples = [l for l in r.stdout.splitlines() if not l.startswith("#")]
    assert len(samples) == 2 + 5 + 1 + 1, samples          # settings, statuses (waived too), warnings, last run

    r = proxytune("tune", "check", "-p", "linux/proxy", "--only", "mount:*", "--cache-dir", str(cache),
                  "--format", "prometheus")
    (labels, _), = families(r.stdout)["proxytune_setting_met"]
    assert labels["setting"] == f"mount:{cache}:noatime"


def test_prometheus_output_never_follows_a_symlink(sandbox, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    link = tmp_path / "proxytune.prom"
    link.symlink_to(victim)
    r = proxytune("tune", "check", "--service", "ptmon", "--format", "prometheus", "-o", str(link))
    assert r.returncode == 2 and "symlink" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert victim.read_text() == "keep me\n" and link.is_symlink()


doctor_tools = pytest.mark.skipif(not (IS_ROOT and shutil.which("bpftrace") and shutil.which("cc")),
                                  reason="needs root, bpftrace and cc")


@doctor_tools
def test_doctor_speaks_nagios_and_prometheus(tmp_path):
    """A poll() loop over 3000 idle connections: the doctor's poll-scan finding (high severity) is
    CRITICAL on the plugin line and one sample by id and severity in the textfile."""
    exe = tmp_path / "loopserver"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(REPO / "tests/servers/loopserver.c")], check=True)
    p = subprocess.Popen([str(exe), "--mode", "poll", "--idle", "3000", "--busy", "4", "--seconds", "60"],
                         stdout=subprocess.PIPE, text=True)
    try:
        pid = p.stdout.readline().split()[1]
        rc, state, text, perf = plugin("doctor", "--pid", pid, "--duration", "3", "--no-perf", "--format", "nagios")
        assert (rc, state) == (2, "CRITICAL") and "high poll-scan" in text, text
        assert perf["findings"][0] >= 1 and perf["high"][0] >= 1 and perf["critical"][0] >= 1
        out = tmp_path / "doctor.prom"
        r = proxytune("doctor", "--pid", pid, "--duration", "3", "--no-perf", "--format", "prometheus", "-o", str(out))
        assert r.returncode == 1, r.stderr
        fams = families(out.read_text())
        assert ({"id": "poll-scan", "severity": "high"}, 1.0) in fams["proxytune_doctor_findings"]
        assert fams["proxytune_last_run_timestamp_seconds"][0][0]["command"] == "doctor"
    finally:
        p.kill()
        p.wait()

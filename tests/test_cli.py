"""The CLI as users meet it: --json that validates against the result
schema, exit codes 0/1/2, nothing destructive without --yes, help that
answers, and the report the README's main command writes."""

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import jsonschema
import pytest

from conftest import REPO

from proxytune.reports.schema import result_schema, validate
from proxytune.tune import profile


def test_check_json_lists_every_setting_of_linux_proxy(sandbox, cli):
    r = cli("tune", "check", "--json", "--cache-dir", "/var/spool/squid")
    assert r.exit_code in (0, 1), r.output
    doc = json.loads(r.output)
    validate(doc)
    rows = {s["setting"]: s for s in doc["data"]["settings"]}
    wanted = {f"{s.backend}:{s.key}".replace("{service}", "squid").replace("{user}", "proxy")
              .replace("{cache_dir}", "/var/spool/squid") for s in profile.load("linux/proxy").raw}
    assert set(rows) == wanted
    for row in rows.values():
        assert row["status"] in ("met", "drift", "n/a", "error")
        assert {"current", "wanted", "reason", "source"} <= set(row)
    assert rows["sysctl:fs.nr_open"]["current"] == int(open("/proc/sys/fs/nr_open").read())
    host = doc["host"]
    assert host["cores"] >= 1 and host["kernel"] and host["filesystems"][0]["path"] == "/var/spool/squid"
    assert (r.exit_code == 1) == any(s["status"] == "drift" for s in rows.values())


def test_schema_rejects_a_result_without_host(sandbox, cli):
    doc = json.loads(cli("tune", "check", "--json").output)
    del doc["host"]
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)
    assert result_schema()["properties"]["schema"]["const"] == "proxytune.result/1"


def test_exit_0_when_all_met(sandbox, cli, tmp_path):
    p = tmp_path / "met.toml"
    p.write_text('[profile]\nos = "linux"\n[sysctl."fs.nr_open"]\nat_least = 64\nreason = "r"\nsource = "s"\n')
    assert cli("tune", "check", "-p", str(p), "--service", "no-such-proxy").exit_code == 0


def test_apply_without_yes_and_without_a_terminal_refuses(sandbox, cli):
    r = cli("tune", "apply", "--only", "limits:*", "--user", "proxy")
    assert r.exit_code == 2
    assert "without --yes" in r.stderr
    assert not sandbox.state_dir.exists() and not (sandbox.root / "etc/security").exists()


def test_plan_changes_nothing_and_shows_steps(sandbox, cli):
    r = cli("tune", "plan", "--only", "limits:*", "--user", "proxy", "--json")
    doc = json.loads(r.output)
    assert [s["kind"] for s in doc["data"]["steps"]] == ["file"]
    assert not (sandbox.root / "etc/security").exists() and not sandbox.state_dir.exists()


def test_only_that_matches_nothing_is_an_error(sandbox, cli):
    r = cli("tune", "check", "--only", "nosuch:*")
    assert r.exit_code == 2 and "leave no setting" in r.stderr


def test_rollback_with_empty_journal(sandbox, cli):
    r = cli("tune", "rollback", "--yes")
    assert r.exit_code == 2 and "nothing to roll back" in r.stderr


def test_profiles_list_and_show(cli):
    rows = json.loads(cli("profiles", "list", "--json").output)["data"]["profiles"]
    names = {r["name"] for r in rows}
    assert {"linux/proxy", "linux/squid-2000", "freebsd/proxy"} <= names
    shown = json.loads(cli("profiles", "show", "linux/squid-2000", "--json").output)["data"]
    settings = {s["setting"]: s for s in shown["settings"]}
    assert settings["sysctl:net.ipv4.ip_local_port_range"]["wanted"] == [1024, 32768]
    assert settings["sysctl:net.ipv4.tcp_max_syn_backlog"]["wanted"] == 1024
    assert settings["rlimit:{service}:nofile"]["wanted"] == 8192
    assert all(s["reason"] and s["source"] for s in shown["settings"])
    # the include: linux/squid is linux/proxy with Debian's parameters
    squid = json.loads(cli("profiles", "show", "linux/squid", "--json").output)["data"]
    assert len(squid["settings"]) == len(json.loads(cli("profiles", "show", "linux/proxy", "--json").output)["data"]["settings"])
    assert squid["params"] == {"service": "squid", "user": "proxy"}


@pytest.mark.parametrize("command", [[], ["tune"], ["tune", "check"], ["tune", "plan"], ["tune", "apply"],
                                     ["tune", "rollback"], ["tune", "export"], ["tune", "history"],
                                     ["profiles", "show"], ["report"]])
def test_help_answers(command, cli):
    r = cli(*command, "--help")
    assert r.exit_code == 0 and "Usage:" in r.output


def test_report_has_every_section_and_figure_in_html_markdown_and_valid_json(default_report):
    """One default report (run once for the suite: conftest.default_report) checked for its formats and
    for everything measured in it."""
    import os
    out, r = default_report.out, default_report.run
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    validate(doc)
    audit = doc["data"]["sections"]["audit"]
    assert audit["profile"] == "linux/proxy" and audit["settings"]
    root = os.geteuid() == 0
    expected = {"audit", "seeds", "events", "fdscan"} | ({"storage", "host_settings"} if root else set())
    assert set(doc["data"]["sections"]) == expected, doc["data"].get("skipped")
    figures = ["events-cost.png", "events-batching.png", "fdscan.png"]
    if root:
        figures += ["storage-throughput.png", "storage-latency.png", "storage-fs.png", "proxy.png"]
        # every classic result this host can measure is measured: all but kqueue, which Linux lacks
        rows = {r["seed"]: r for r in doc["data"]["sections"]["seeds"]["rows"]}
        unmeasured = {k for k, r in rows.items() if r["verdict"] == "not measurable here"}
        assert unmeasured == {"kqueue"}, {k: rows[k]["reason"] for k in unmeasured}
    else:
        assert "needs root" in doc["data"]["skipped"]["storage"]
    html = (out / "report.html").read_text()
    assert "<table>" in html and "http://" not in html.replace("http://www.w3.org", "") and "<script" not in html
    assert html.count('src="data:image/png;base64,') == len(figures)
    md = (out / "report.md").read_text()
    assert "sysctl:net.core.somaxconn" in md and doc["host"]["kernel"] in md
    for png in figures:
        assert f"({png})" in md and (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- errors a person can act on

NOBODY_HINTS = ("chown", "chmod", "owned by uid 65534", "lacks")     # what would mislead a non-root user


def assert_needs_root(r, command: str, why: str):
    """One error line saying `COMMAND needs root: WHY...`, a hint to rerun it as root, nothing misleading."""
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 2, r.stderr
    assert lines[0].startswith(f"proxytune: error: {command} needs root: {why}"), r.stderr
    assert lines[1] == f"hint: run it as root: `sudo proxytune {command} ...`", r.stderr
    assert not any(word in r.stderr for word in NOBODY_HINTS), r.stderr


@pytest.fixture
def roots_state_dir():
    """A state directory as root leaves it (0700 root), in a directory anyone may traverse."""
    top = Path(tempfile.mkdtemp(prefix="pt-rootstate-"))
    top.chmod(0o755)
    (top / "state").mkdir(mode=0o700)
    try:
        yield top / "state"
    finally:
        shutil.rmtree(top)


def test_non_root_apply_rollback_history_say_needs_root_not_chown(as_nobody, roots_state_dir):
    somaxconn = Path("/proc/sys/net/core/somaxconn").read_text()
    mine = as_nobody.scratch / f"state-{os.getpid()}"
    for state in (roots_state_dir, mine):
        r = as_nobody("--state-dir", str(state), "tune", "apply", "--yes", "--only", "sysctl:net.core.somaxconn",
                      "-p", "linux/proxy")
        assert_needs_root(r, "tune apply", "it changes sysctl:net.core.somaxconn live")
    assert not mine.exists(), "refused before anything was written, the journal included"
    assert Path("/proc/sys/net/core/somaxconn").read_text() == somaxconn
    for command in (["tune", "rollback", "--yes"], ["tune", "history"]):
        r = as_nobody("--state-dir", str(roots_state_dir), *command)
        assert_needs_root(r, " ".join(command[:2]), f"the state directory {roots_state_dir} is root's")
    assert os.listdir(roots_state_dir) == []


def test_non_root_files_only_apply_to_its_own_root_is_not_told_to_be_root(as_nobody):
    """Where root is not the cause (an image of one's own, --files-only) no 'needs root' stands in the way."""
    img, state = as_nobody.scratch / f"img-{os.getpid()}", as_nobody.scratch / f"st-{os.getpid()}"
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "mkdir", "-p",
                        str(img / "etc")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    apply = ["tune", "apply", "--files-only", "--only", "limits:*", "--user", "nobody", "--yes"]
    roots = Path(tempfile.gettempdir()) / f"pt-roots-{os.getpid()}" / "state"     # /tmp is writable: one below
    try:
        Path(roots.parent).mkdir(mode=0o755)
        r = as_nobody("--root", str(img), "--state-dir", str(roots), *apply)
        assert_needs_root(r, "tune apply", f"cannot create the state directory {roots} (Permission denied)")
        assert not (img / "etc/security").exists()
    finally:
        shutil.rmtree(roots.parent, ignore_errors=True)
    args = ["--root", str(img), "--state-dir", str(state)]
    r = as_nobody(*args, *apply)
    assert r.returncode == 0, r.stderr
    written = img / "etc/security/limits.d/90-proxytune.conf"
    assert "nobody\tsoft\tnofile" in written.read_text() and written.stat().st_uid == 65534
    r = as_nobody(*args, "tune", "rollback", "--yes")
    assert r.returncode == 0 and not written.exists(), r.stderr


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "120"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_non_root_doctor_and_probes_say_needs_root_and_why(as_nobody, sleeper):
    """probe run: an unreadable tracefs is the cause, not a kernel without the tracepoints."""
    if not shutil.which("perf"):
        pytest.skip("needs perf (linux-perf) for the hotspots case")
    pid = str(sleeper)
    assert_needs_root(as_nobody("doctor", "--pid", pid, "-d", "1"), "doctor", "it attaches bpftrace")
    r = as_nobody("probe", "run", "pollscan", "--pid", pid, "-d", "1")
    assert_needs_root(r, "probe run", "tracefs: /sys/kernel/tracing is readable by root only")
    if Path("/proc/sys/kernel/perf_event_paranoid").read_text().strip() not in ("-1",):
        assert_needs_root(as_nobody("probe", "hotspots", "--pid", pid, "-d", "1"), "probe hotspots",
                          "system-wide sampling needs root")


def test_non_root_permission_denied_is_one_line_naming_the_path_not_a_bug(as_nobody, roots_state_dir):
    """A config directory of root's (a HOME inherited by `su` without `-`) is not readable by the user."""
    config = roots_state_dir / "config"
    r = as_nobody("tune", "check", "--only", "sysctl:*", env={"XDG_CONFIG_HOME": str(config)})
    assert r.returncode == 2 and "Traceback" not in r.stderr and "bug" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [f"proxytune: error: permission denied: {config}/proxytune/profiles",
                                     "hint: uid 65534 may not use it: run it as a user who may, e.g. root: "
                                     "`sudo proxytune ...`"]


def test_non_root_check_says_reading_another_users_limits_needs_root(as_nobody, sleeper):
    r = as_nobody("tune", "check", "--service", "sleep", "--only", "rlimit:*", "--json")
    row = json.loads(r.stdout)["data"]["settings"][0]
    assert r.returncode == 2 and row["status"] == "error", r.stdout
    assert "permission denied (another user's process: reading them needs root)" in row["error"]


@pytest.mark.parametrize("command, why", [
    (["bench", "storage", "--quick"], "it makes loop devices and mounts them"),
    (["bench", "proxy", "--quick"], "it starts squid"),
    (["probe", "overhead", "--reps", "1"], "it attaches bpftrace and perf -a"),
])
def test_non_root_benches_say_needs_root_before_starting(as_nobody, command, why):
    r = as_nobody("--state-dir", str(as_nobody.scratch / "unused"), *command)
    assert_needs_root(r, " ".join(command[:2]), why)
    assert not (as_nobody.scratch / "unused").exists() and r.stdout == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="tracefs is root's")
def test_missing_tracepoints_are_named_when_tracefs_is_readable():
    """On a fresh host tracefs is not mounted yet: mounted here as the tool would (and unmounted after,
    when this test mounted it), so the test runs on every root host rather than after some other test."""
    from proxytune.probes import bpftrace, caps
    mounted_before = (bpftrace.TRACING / "events").is_dir()
    tracefs = caps.ensure_tracefs()
    if not tracefs.ok:
        pytest.skip(f"tracefs: {tracefs.why}")
    try:
        script = bpftrace.Script("t", Path("t.bt"), "t", "", "", ["syscalls:sys_enter_poll", "nosuch:tracepoint"])
        assert bpftrace.missing_tracepoints(script) == ["nosuch:tracepoint"]
    finally:
        if not mounted_before:
            subprocess.run(["umount", str(bpftrace.TRACING)], check=False)


def test_unreadable_tracefs_is_an_error_never_missing(monkeypatch, tmp_path):
    """As root, a tracefs that denies reading (a locked-down host, a container) is not 'tracepoints missing'."""
    from proxytune.core.errors import ProxytuneError
    from proxytune.probes import bpftrace

    def denied(self):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(Path, "exists", denied)
    with pytest.raises(ProxytuneError, match="cannot tell whether tracepoint syscalls:sys_enter_poll exists"):
        bpftrace.tracepoint_exists("syscalls:sys_enter_poll")


@pytest.fixture
def checkout(tmp_path):
    """A checkout of our own: the launcher, the package, a .venv (the real one's python) already set up."""
    top = tmp_path / "checkout"
    top.mkdir()
    for part in ("proxytune", "pyproject.toml", "cli.py", "commands", "core", "proxies", "tune", "probes", "reports", "profiles"):
        src = REPO / part
        (shutil.copytree(src, top / part, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir()
         else shutil.copy2(src, top / part))
    (top / ".venv/bin").mkdir(parents=True)
    python = top / ".venv/bin/python"
    python.write_text(f"#!/bin/sh\nexec {REPO / '.venv/bin/python'} \"$@\"\n")
    python.chmod(0o755)
    (top / ".venv/.installed").touch()
    return top


def history_hint(argv, cwd, env=None):
    """The hint of `... tune rollback --id nope`, which names `tune history`."""
    environment = {**os.environ, "PROXYTUNE_NO_INSTALL": "1", **(env or {})}
    r = subprocess.run([*argv, "tune", "rollback", "--id", "nope"], capture_output=True, text=True, cwd=cwd,
                       env=environment, timeout=60)
    assert r.returncode == 2, r.stderr
    return r.stderr.splitlines()[-1]


def test_hints_name_the_command_as_it_was_invoked(checkout, tmp_path, as_nobody):
    assert history_hint(["./proxytune"], checkout) == "hint: see `./proxytune tune history`"
    assert history_hint([str(checkout / "proxytune")], tmp_path) == f"hint: see `{checkout}/proxytune tune history`"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "proxytune").symlink_to(checkout / "proxytune")
    on_path = history_hint(["proxytune"], tmp_path, {"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert on_path == "hint: see `proxytune tune history`"
    # installed (no launcher beside cli.py): `proxytune`, even with a launcher's variable inherited
    r = as_nobody("tune", "rollback", "--id", "nope", env={"PROXYTUNE_PROG": str(checkout / "proxytune")})
    assert r.stderr.splitlines()[-1] == "hint: see `proxytune tune history`", r.stderr


def test_no_hint_hard_codes_the_checkout_command():
    """Every hint goes through core/invocation.py: no `./proxytune CMD` or `sudo proxytune` typed in the code."""
    offenders = []
    for path in REPO.glob("**/*.py"):
        if {".venv", "tests", "build"} & set(path.relative_to(REPO).parts):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"sudo \S*proxytune|\./proxytune [a-z]", line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert offenders == []


# ---------------------------------------------------------------- who can undo a file

@pytest.mark.parametrize("fmt", ["sysctl.d", "limits.d", "systemd", "tuned", "ansible"])
def test_an_export_never_promises_a_rollback_no_journal_covers(fmt, sandbox, cli):
    """Exported files are installed by the user, not by apply: rollback cannot undo them, and they say how to."""
    text = cli("tune", "export", "--format", fmt, "--service", "squid", "--user", "proxy").output
    assert "rollback removes" not in text and "rollback restores" not in text, text
    assert "no journal entry covers it" in text and "`proxytune tune rollback` does not undo it" in text
    assert re.search(r"(?i)to undo\b", text), text


def test_freebsd_export_says_how_to_undo(cli):
    text = cli("tune", "export", "--format", "freebsd", "-p", "freebsd/proxy").output
    assert "rollback removes" not in text and "To undo: take these lines out" in text


def test_exported_dropins_carry_their_own_undo_and_the_applied_one_its_rollback(sandbox, cli):
    """Each drop-in an export writes (the systemd text, the playbook's content) says `remove this file`;
    the one apply writes (journaled) says rollback undoes it. Both are named 50-proxytune.conf."""
    export = cli("tune", "export", "--format", "systemd", "--only", "service:*", "--service", "squid").output
    body = export.split("# /etc/systemd/system/squid.service.d/50-proxytune.conf\n", 1)[1]
    assert body.startswith("# Exported by proxytune: to undo, remove this file")
    playbook = cli("tune", "export", "--format", "ansible", "--only", "service:*", "--service", "squid").output
    assert 'squid.service.d/50-proxytune.conf"' in playbook
    assert '"# Exported by proxytune: to undo, remove this file' in playbook
    assert cli("tune", "apply", "--only", "service:*", "--service", "squid", "--yes").exit_code in (0, 1)
    applied = (sandbox.root / "etc/systemd/system/squid.service.d/50-proxytune.conf").read_text()
    assert applied.startswith("# Written by proxytune; `proxytune tune rollback` removes or restores it.\n")
    assert journal_paths(sandbox) == [str(sandbox.root / "etc/systemd/system/squid.service.d/50-proxytune.conf")]


def journal_paths(sandbox) -> list[str]:
    """The file paths the journal covers."""
    return [s["path"] for f in (sandbox.state_dir / "journal").glob("*.json")
            for s in json.loads(f.read_text())["steps"] if s["kind"] == "file"]

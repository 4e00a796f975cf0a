"""Output conventions: every option explains itself, and piped tables are
plain tab-separated rows that awk and cut can read (no box drawing)."""

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import jsonschema
import pytest

from conftest import IS_ROOT, proxytune

BOX = re.compile("[\u2500-\u259f]")     # box drawing and block elements


def walk(command, path=("proxytune",)):
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from walk(sub, path + (name,))


def test_every_option_of_every_command_has_help():
    from proxytune.cli import main
    missing = [f"{' '.join(path)} {'/'.join(p.opts)}" for path, cmd in walk(main) for p in cmd.params
               if isinstance(p, click.Option) and not (p.help or "").strip()]
    assert not missing, f"options without help: {missing}"
    undocumented = [" ".join(path) for path, cmd in walk(main) if not (cmd.help or "").strip()]
    assert not undocumented, f"commands without a docstring: {undocumented}"


def test_every_command_has_json():
    from proxytune.cli import main
    # export, man and completion print a file format and report writes files; compare writes a directory
    exempt = {("proxytune", "tune", "export"), ("proxytune", "report"), ("proxytune", "report", "compare"),
              ("proxytune", "schema"),  # prints a JSON Schema, always
              ("proxytune", "report", "fleet"), ("proxytune", "man"), ("proxytune", "completion")}
    lacking = [" ".join(path) for path, cmd in walk(main) if not isinstance(cmd, click.Group) and path not in exempt
               and not any("--json" in p.opts for p in cmd.params)]
    assert not lacking, f"commands without --json: {lacking}"


def test_piped_check_prints_tab_separated_rows(sandbox):
    r = proxytune("--root", str(sandbox.root), "tune", "check", "--profile", "linux/proxy", "--service", "nosuchproxy")
    assert r.returncode in (0, 1), r.stderr
    assert not BOX.search(r.stdout), r.stdout
    lines = r.stdout.splitlines()
    header = lines.index("setting\tcurrent\twanted\tstatus\treason / note")
    rows = [l.split("\t") for l in lines[header + 1:] if "\t" in l]
    assert len(rows) >= 10 and all(len(row) == 5 for row in rows), rows
    by_setting = {row[0]: row for row in rows}
    assert by_setting["sysctl:fs.nr_open"][3] in ("met", "drift")
    assert {row[3] for row in rows} <= {"met", "drift", "n/a", "error"}
    assert lines[header - 1] == "# tune check: linux/proxy"


def test_format_forces_tsv_or_table(sandbox):
    from proxytune.cli import main
    from click.testing import CliRunner
    tsv = CliRunner().invoke(main, ["--format", "tsv", "profiles", "list"])
    assert tsv.exit_code == 0 and "linux/proxy\tshipped\tlinux\t" in tsv.output
    table = CliRunner().invoke(main, ["--format", "table", "profiles", "list"])
    assert table.exit_code == 0 and BOX.search(table.output) and "\t" not in table.output
    bad = CliRunner().invoke(main, ["--format", "csv", "profiles", "list"])
    assert bad.exit_code == 2


def test_a_cell_with_a_tab_or_newline_stays_one_cell():
    from rich.table import Table
    from proxytune.core.console import tsv_lines
    t = Table(title="t")
    t.add_column("a")
    t.add_column("b")
    t.add_row("x\ty", "line1\nline2")
    t.add_row("[/not-markup]", "[green]met[/]")
    assert tsv_lines(t) == ["# t", "a\tb", "x y\tline1 line2", "[/not-markup]\tmet"]


def test_piped_bench_events_quick_has_no_box_drawing(tmp_path):
    r = proxytune("bench", "events", "--quick", "--backend", "epoll", "-o", str(tmp_path / "e.json"), timeout=300)
    assert r.returncode == 0, r.stderr
    assert not BOX.search(r.stdout + r.stderr), r.stdout
    assert any(l.count("\t") >= 2 for l in r.stdout.splitlines())


def test_piped_probe_list_is_rows_too():
    r = proxytune("probe", "list")
    rows = [l.split("\t") for l in r.stdout.splitlines() if not l.startswith("#")]
    assert rows[0] == ["name", "purpose", "tracepoints"] and len(rows) > 5
    assert all(len(row) == 3 for row in rows) and "pollscan" in {row[0] for row in rows}


def test_piped_check_is_rows_and_comment_lines_only(sandbox):
    """`tune check | awk -F'\\t'`: every line is a row of the table or a '#' comment (title, summary,
    notes, parameters), so filtering '#' leaves the header and the rows."""
    r = proxytune("tune", "check", "--profile", "linux/proxy", "--service", "nosuchproxy")
    assert r.returncode in (0, 1), r.stderr
    lines = r.stdout.splitlines()
    data = [l for l in lines if not l.startswith("#")]
    assert data[0] == "setting\tcurrent\twanted\tstatus\treason / note"
    assert len(data) >= 10 and all(l.count("\t") == 4 for l in data), [l for l in data if l.count("\t") != 4]
    assert "# parameters: service=nosuchproxy (command line)" in " ".join(lines)
    plan = proxytune("tune", "plan", "--service", "nosuchproxy").stdout.splitlines()
    assert all(l.startswith("#") or l.count("\t") == 5 for l in plan) and "# apply would run" in "\n".join(plan)


def test_global_options_are_accepted_after_every_command():
    from proxytune.cli import main
    lacking = [f"{' '.join(path)} {opt}" for path, cmd in walk(main) if path != ("proxytune",)
               for opt in ("--root", "--state-dir", "--format", "--debug")
               if not any(opt in p.opts for p in cmd.params)]
    assert not lacking, lacking


def test_global_options_after_the_subcommand_do_what_they_do_before_it(sandbox, tmp_path):
    site = tmp_path / "elsewhere"
    (site / "etc/proxytune/profiles/site").mkdir(parents=True)
    (site / "etc/proxytune/profiles/site/late.toml").write_text(
        '[profile]\ndescription = "late"\nos = "linux"\n[sysctl."net.core.somaxconn"]\nat_least = 1\n'
        'reason = "r"\nsource = "s"\n')
    after = proxytune("profiles", "list", "--format", "tsv", "--root", str(site))
    before = proxytune("--format", "tsv", "--root", str(site), "profiles", "list")
    assert after.returncode == 0 and after.stdout == before.stdout and "site/late\tsite\t" in after.stdout
    assert BOX.search(proxytune("tune", "check", "--service", "x", "--format", "table").stdout)
    # the state dir given after the command wins over the environment's (an unusable one here)
    unusable = tmp_path / "a-file"
    unusable.write_text("")
    good = tmp_path / "state"
    r = proxytune("tune", "history", "--json", "--state-dir", str(good), env={"PROXYTUNE_STATE_DIR": str(unusable)})
    assert r.returncode == 0 and json.loads(r.stdout)["data"]["entries"] == [], r.stderr
    assert proxytune("tune", "history", env={"PROXYTUNE_STATE_DIR": str(unusable)}).returncode == 2


# How each command with --json is run here; ELSEWHERE: run in the test named (long or many hosts).
JSON_RUNS = {
    ("tune", "check"): ["--service", "ptout"],
    ("tune", "plan"): ["--service", "ptout"],
    ("tune", "apply"): ["--files-only", "--only", "limits:*", "--service", "ptout", "--user", "proxy", "--yes"],
    ("tune", "rollback"): ["--yes"],
    ("tune", "history"): [],
    ("status",): [],
    ("profiles", "list"): [],
    ("profiles", "show"): ["linux/proxy"],
    ("probe", "caps"): [],
    ("probe", "list"): [],
    ("probe", "run"): ["syscall_mix", "--pid", "PID", "-d", "0.5"],
    ("probe", "hotspots"): ["--pid", "PID", "-d", "0.5"],
    ("probe", "cachemiss"): ["--", "true"],
    ("doctor",): ["--pid", "PID", "-d", "1", "--no-perf"],
    ("bench", "fdscan"): ["--quick", "-o", "OUT"],
}
ELSEWHERE = {
    ("bench", "events"): "test_harness_errors (bench events --quick --json)",
    ("bench", "storage"): "test_adversarial_probes (bench storage --quick --json)",
    ("bench", "proxy"): "test_proxies (bench proxy -o: its result file)",
    ("probe", "overhead"): "test_overhead (probe overhead --json)",
    ("fleet", "check"): "test_fleet", ("fleet", "plan"): "test_fleet", ("fleet", "doctor"): "test_fleet",
    ("fleet", "apply"): "test_fleet", ("fleet", "rollback"): "test_fleet",
    ("watch", "history"): "test_watch_cli (watch history --json over a recorder the real code path filled)",
    ("watch", "show"): "test_watch_cli (watch show --json: an episode's worst window)",
    ("watch", "status"): "test_watch_status (watch status --json over a recorder the real code path filled)",
}


def test_every_command_with_json_is_run_somewhere():
    from proxytune.cli import main
    with_json = {path[1:] for path, cmd in walk(main) if any("--json" in p.opts for p in cmd.params)}
    assert with_json == set(JSON_RUNS) | set(ELSEWHERE)


@pytest.fixture(scope="module")
def idle_pid():
    p = subprocess.Popen(["sleep", "120"])
    yield str(p.pid)
    p.kill()
    p.wait()


@pytest.mark.parametrize("command", list(JSON_RUNS), ids=" ".join)
def test_every_json_output_is_the_versioned_envelope(sandbox, tmp_path, idle_pid, command):
    needs = {"run": "bpftrace", "hotspots": "perf", "cachemiss": "valgrind", "doctor": "bpftrace", "fdscan": "cc"}
    tool = needs.get(command[-1])
    if tool and not (IS_ROOT and shutil.which(tool)):
        pytest.skip(f"needs root and {tool}")
    if command in (("tune", "rollback"), ("status",)):
        assert proxytune("tune", "apply", *JSON_RUNS[("tune", "apply")]).returncode in (0, 1)
    args = [{"PID": idle_pid, "OUT": str(tmp_path / "out.json")}.get(a, a) for a in JSON_RUNS[command]]
    if "--" in args:
        at = args.index("--")
        args[at:at] = ["--json"]
    else:
        args.append("--json")
    r = proxytune(*command, *args, timeout=300)
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    from proxytune.reports.schema import validate
    validate(doc)
    assert doc["schema"] == "proxytune.result/1" and isinstance(doc["data"], dict)
    schema = json.loads(proxytune("schema", doc["kind"]).stdout)       # what `proxytune schema KIND` publishes
    jsonschema.validate(doc, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**doc, "kind": "nonsense"}, schema)


def test_schema_refuses_an_unknown_kind():
    r = proxytune("schema", "nonsense")
    assert r.returncode == 2 and "no result kind 'nonsense'" in r.stderr and not r.stdout


def test_several_running_proxies_are_named_in_one_line(tmp_path):
    """Two proxies run (copies of sleep named nginx and haproxy): the audit says which one it
    audits and which it leaves out, in one note, and the JSON's parameter source says so too."""
    procs = []
    try:
        for name in ("haproxy", "nginx"):
            exe = tmp_path / name
            shutil.copy("/bin/sleep", exe)
            procs.append(subprocess.Popen([str(exe), "120"]))
        r = proxytune("tune", "check", "--only", "sysctl:fs.nr_open", "--json", env={"PROXYTUNE_ROOT": "/"})
        doc = json.loads(r.stdout)["data"]
        chosen, source = doc["params"]["values"]["service"], doc["params"]["sources"]["service"]
        note, = [n for n in doc["notes"] if n.startswith("several proxies run: ")]
        assert chosen in ("squid", "nginx") and f"auditing {chosen} " in note, note   # fixed order, not start order
        assert "haproxy" in note.split(", not ", 1)[1] and "also running: " in source and "haproxy" in source
        assert "pass --service NAME" in note
        piped = proxytune("tune", "check", "--only", "sysctl:fs.nr_open", env={"PROXYTUNE_ROOT": "/"}).stdout
        assert sum(1 for l in piped.splitlines() if "several proxies run" in l) == 1
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_exports_leave_a_detected_service_and_user_as_variables(sandbox, tmp_path):
    text = proxytune("tune", "export", "--format", "limits.d").stdout
    assert "@PROXY_USER@\tsoft\tnofile\t65536" in text and "# @PROXY_USER@: the proxy's user on the target host" in text
    named = proxytune("tune", "export", "--format", "limits.d", "--user", "proxy").stdout
    assert "proxy\tsoft\tnofile" in named and "@PROXY_USER@" not in named          # given: written in
    drop_in = proxytune("tune", "export", "--format", "systemd").stdout
    assert "# /etc/systemd/system/@PROXY_SERVICE@.service.d/50-proxytune.conf" in drop_in
    book = proxytune("tune", "export", "--format", "ansible").stdout
    assert '    proxytune_service: "squid"' in book and '    proxytune_user: "proxy"' in book
    from proxytune.tune.export import MASTERS
    tasks = book.split("  tasks:", 1)[1].replace(MASTERS, "")     # the registry's executables are not the service
    assert "squid" not in tasks and "proxytune-service-var" not in book and "proxytune-user-var" not in book


@pytest.mark.skipif(not (IS_ROOT and shutil.which("ansible-playbook")), reason="needs root and ansible-playbook")
def test_the_playbook_takes_service_and_user_from_its_variables(sandbox, tmp_path):
    """The playbook run for real (mount and network namespace): -e names the service and user; a met
    login limit of that user is left alone, a low one raised; a hostile name stops at the check."""
    book = tmp_path / "book.yml"
    assert proxytune("tune", "export", "--format", "ansible", "--only", "limits:*", "--only", "service:*",
                     "-o", str(book)).returncode == 0
    (tmp_path / "units").mkdir()
    (tmp_path / "limits.d").mkdir()
    home = tmp_path / "ansible-home"
    env = {**os.environ, "ANSIBLE_HOME": str(home), "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
           "ANSIBLE_REMOTE_TEMP": str(home / "rtmp"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3", "D": str(tmp_path)}
    play = (f'ansible-playbook -c local -i localhost, -e proxytune_systemd_dir="$D/units" '
            f'-e proxytune_limits_file="$D/out.conf" "$D/book.yml"')

    def run(site_line: str, user: str) -> subprocess.CompletedProcess:
        (tmp_path / "limits.d/50-site.conf").write_text(site_line)
        script = (f'mount --bind "$D/limits.d" /etc/security/limits.d && '
                  f"{play} -e proxytune_service=ptsvc -e proxytune_user={shlex.quote(user)}")
        return subprocess.run(["unshare", "-m", "-n", "bash", "-euo", "pipefail", "-c", script],
                              capture_output=True, text=True, env=env, timeout=400)

    r = run("ptuser\t-\tnofile\t100000\n", "ptuser")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert (tmp_path / "units/ptsvc.service.d/50-proxytune.conf").read_text().endswith("LimitNOFILE=65536\n")
    assert not (tmp_path / "out.conf").exists()                   # ptuser's limit is already above: met
    r = run("ptuser\t-\tnofile\t1024\n", "ptuser")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert re.search(r"^ptuser\s+-\s+nofile\s+65536$", (tmp_path / "out.conf").read_text(), re.M)
    r = run("", "x; touch /tmp/ptout-pwned")
    assert r.returncode != 0 and "proxytune_user must be a plain user name" in r.stdout
    assert not Path("/tmp/ptout-pwned").exists()


def test_the_shipped_schema_is_a_valid_json_schema():
    schema = json.loads(proxytune("schema").stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    kinds = schema["properties"]["kind"]["enum"]
    assert {"audit", "history", "profiles", "profile", "probe"} <= set(kinds)
    for kind in kinds:
        jsonschema.Draft202012Validator.check_schema(json.loads(proxytune("schema", kind).stdout))

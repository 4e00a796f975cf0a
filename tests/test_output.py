"""Output conventions: every option explains itself, and piped tables are
plain tab-separated rows that awk and cut can read (no box drawing)."""

import json
import re
import shutil
import subprocess

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
    # export prints a file format and report writes files; compare writes a directory
    exempt = {("proxytune", "tune", "export"), ("proxytune", "report"), ("proxytune", "report", "compare"),
              ("proxytune", "schema"),  # prints a JSON Schema, always
              ("proxytune", "report", "fleet")}
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
    if command == ("tune", "rollback"):
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

"""Output conventions: every option explains itself, and piped tables are
plain tab-separated rows that awk and cut can read (no box drawing)."""

import re

import click

from conftest import proxytune

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

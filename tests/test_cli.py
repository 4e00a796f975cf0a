"""The CLI as users meet it: --json that validates against the result
schema, exit codes 0/1/2, nothing destructive without --yes, help that
answers, and the report the README's main command writes."""

import json

import jsonschema
import pytest

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


def test_report_writes_html_markdown_and_valid_json(sandbox, cli, tmp_path):
    out = tmp_path / "rep"
    r = cli("report", "-o", str(out))
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "report.json").read_text())
    validate(doc)
    audit = doc["data"]["sections"]["audit"]
    assert audit["profile"] == "linux/proxy" and audit["settings"]
    html = (out / "report.html").read_text()
    assert "<table>" in html and "http://" not in html.replace("http://www.w3.org", "") and "<script" not in html
    md = (out / "report.md").read_text()
    assert "sysctl:net.core.somaxconn" in md and doc["host"]["kernel"] in md


def test_report_with_benchmarks_has_every_section_and_figure(sandbox, cli, tmp_path):
    out = tmp_path / "full"
    r = cli("report", "-o", str(out))
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "report.json").read_text())
    validate(doc)
    import os
    expected = {"audit", "seeds", "events", "fdscan"} | ({"storage"} if os.geteuid() == 0 else set())
    assert set(doc["data"]["sections"]) == expected, doc["data"].get("skipped")
    figures = ["events-cost.png", "events-batching.png", "fdscan.png"]
    if "storage" in expected:
        figures += ["storage-throughput.png", "storage-latency.png", "storage-fs.png"]
    else:
        assert "needs root" in doc["data"]["skipped"]["storage"]
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == len(figures)
    md = (out / "report.md").read_text()
    for png in figures:
        assert f"({png})" in md and (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""`watch history` and `watch show` over a recorder filled by the real code path, and the CLI's refusals."""

import json
from datetime import datetime, timezone

import pytest

from test_watch_episodes import BUSY, HEALTHY, window
from proxytune.probes import episodes, recorder
from proxytune.reports.schema import validate

T0 = datetime(2026, 1, 15, 8, 0, tzinfo=timezone.utc).timestamp()      # in the past


def fill(sandbox, cells):
    with recorder.Recorder(sandbox.state_dir / "watch", 1 << 20) as r:
        for i, cell in enumerate(cells):
            assert r.append(window(cell, i, t0=T0))
    return episodes.fold(recorder.read(sandbox.state_dir / "watch").records)


@pytest.mark.host  # the result envelope's host fingerprint runs systemd-detect-virt
def test_history_lists_the_episodes(sandbox, cli):
    eps = fill(sandbox, [HEALTHY, BUSY, BUSY, HEALTHY, BUSY])
    r = cli("watch", "history")
    assert r.exit_code == 1, r.output
    assert "5 window(s) recorded" in r.output and "2 episode(s)" in r.output
    assert eps[0]["id"] in r.output and "(2 window(s))" in r.output and "ongoing" in r.output
    r = cli("watch", "history", "--json")
    doc = json.loads(r.output)
    validate(doc)
    assert [e["id"] for e in doc["data"]["episodes"]] == [e["id"] for e in eps]
    assert "worst" not in doc["data"]["episodes"][0] and doc["data"]["episodes"][0]["peak_evidence"]


@pytest.mark.host  # the result envelope's host fingerprint runs systemd-detect-virt
def test_history_since_and_until(sandbox, cli):
    eps = fill(sandbox, [BUSY, HEALTHY, HEALTHY, BUSY])
    r = cli("watch", "history", "--json", "--since", "2026-01-15T08:00:15Z")
    assert [e["id"] for e in json.loads(r.output)["data"]["episodes"]] == [eps[1]["id"]]
    r = cli("watch", "history", "--json", "--until", str(int(T0 + 5)))
    assert [e["id"] for e in json.loads(r.output)["data"]["episodes"]] == [eps[0]["id"]]
    r = cli("watch", "history", "--since", "1h")              # long ago: nothing since an hour
    assert r.exit_code == 0 and "0 episode(s)" in r.output


def test_history_with_nothing_recorded(sandbox, cli):
    r = cli("watch", "history")
    assert r.exit_code == 0 and "no windows recorded yet" in r.output


def test_a_bad_time_is_one_clear_line(sandbox, cli):
    r = cli("watch", "history", "--since", "yesterday;rm -rf /")
    assert r.exit_code == 2 and "is no time" in r.output


@pytest.mark.host  # the result envelope's host fingerprint runs systemd-detect-virt
def test_show_prints_the_worst_window_in_three_formats(sandbox, cli):
    eps = fill(sandbox, [BUSY, BUSY, HEALTHY])
    ident = eps[0]["id"]
    r = cli("watch", "show", ident)
    assert r.exit_code == 0, r.output
    assert f"episode {ident}: 2 window(s)" in r.output and "haproxy-maxconn" in r.output and "fix" in r.output
    doc = json.loads(cli("watch", "show", ident, "--format", "json").output)
    validate(doc)
    assert doc["data"]["probe"] == "doctor" and doc["episode"]["id"] == ident
    assert [f["id"] for f in doc["findings"]] == ["haproxy-maxconn"]
    assert json.loads(cli("watch", "show", ident, "--json").output)["findings"] == doc["findings"]
    md = cli("watch", "show", ident, "--format", "markdown").output
    assert md.startswith("# doctor: ") and "haproxy-maxconn" in md and "**fix**" in md


def test_show_an_unknown_episode(sandbox, cli):
    fill(sandbox, [BUSY])
    r = cli("watch", "show", "20000101T000000Z-nope")
    assert r.exit_code == 2 and "no episode" in r.output


def test_watch_refuses_bad_targets_and_sizes(sandbox, cli):
    assert cli("watch", "--pid", "1", "--unit", "haproxy").exit_code == 2
    r = cli("watch", "--unit", "apache2")
    assert r.exit_code == 2 and "no proxy proxytune knows" in r.output
    r = cli("watch", "--max-size", "lots")
    assert r.exit_code == 2 and "is no size" in r.output
    r = cli("watch", "--max-size", "1K", "--unit", "haproxy")
    assert r.exit_code == 2 and "at least" in r.output


def test_a_relative_state_dir_works(sandbox, cli, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    fill(sandbox, [BUSY])
    r = cli("--state-dir", "state", "watch", "history")
    assert r.exit_code == 1 and "1 episode(s)" in r.output, r.output


@pytest.mark.host  # the result envelope's host fingerprint runs systemd-detect-virt
def test_the_schema_holds_history_to_its_shape(sandbox, cli):
    import jsonschema
    import pytest
    fill(sandbox, [BUSY])
    doc = json.loads(cli("watch", "history", "--json").output)
    del doc["data"]["episodes"][0]["worst_window"]
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)

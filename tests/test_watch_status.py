"""`watch status`: the recorder's last minutes for an operator and for a Nagios check. Windows are built by
the real code path (the live matrix's recorded answers through windows.watched, stored by the recorder)."""

import json
import time

import pytest

from test_watch_episodes import BUSY, HEALTHY, NGINX, window
from proxytune.core import monitoring
from proxytune.probes import recorder, watchstatus, windows
from proxytune.reports.schema import validate


def recent(cells, minutes_ago: float = 5.0):
    """Windows of 10 s, the last ending `minutes_ago` minutes before now."""
    t0 = time.time() - minutes_ago * 60 - 10 * len(cells)
    return [window(c, i, t0=t0) if c not in ("absent", "failed") else
            windows.unwatched("r1", i, t0 + 10 * i, t0 + 10 * i + 10,
                              windows.ABSENT if c == "absent" else windows.FAILED,
                              "no haproxy running" if c == "absent" else "bpftrace exited with -9", "haproxy")
            for i, c in enumerate(cells)]


def state_of(records, minutes=15.0, critical=()):
    now = time.time()
    s = watchstatus.summarise(records, now - minutes * 60, now)
    return watchstatus.nagios(s, minutes, critical)


def test_a_high_finding_in_the_span_is_critical_with_how_many_windows_had_it():
    state, line = state_of(recent([HEALTHY, BUSY, BUSY, HEALTHY]))
    assert state == monitoring.CRITICAL
    assert line.startswith("PROXYTUNE CRITICAL - watch, the last 15 min: high haproxy-maxconn (2 of 4 windows)")
    assert line.endswith("| windows=4;;;0 watched=4;;;0 absent=0;0;;0 failed=0;;;0 findings=1;0;;0")


def test_clean_windows_are_ok_and_older_ones_do_not_count():
    old = recent([BUSY, BUSY], minutes_ago=30)
    state, line = state_of(old + recent([HEALTHY, HEALTHY]))
    assert state == monitoring.OK and "no findings in 2 windows" in line


def test_an_absent_proxy_warns_and_a_medium_finding_is_critical_only_when_named():
    state, line = state_of(recent([HEALTHY, "absent"]))
    assert state == monitoring.WARNING and "the proxy was absent in 1 of 2 windows" in line
    nginx = recent([NGINX])
    sev = {f["id"]: f["severity"] for f in nginx[0]["findings"]}
    medium = [i for i, s in sev.items() if s == "medium"]
    if medium:                                          # the recorded cell's own severities decide the case
        only = [{**nginx[0], "findings": [f for f in nginx[0]["findings"] if f["id"] == medium[0]]}]
        assert state_of(only)[0] == monitoring.WARNING
        assert state_of(only, critical=(medium[0].split("-")[0] + "-*",))[0] == monitoring.CRITICAL


def test_no_window_in_the_span_or_only_failed_ones_is_unknown():
    state, line = state_of([])
    assert state == monitoring.UNKNOWN and "is proxytune-watch running?" in line
    state, line = state_of(recent(["failed", "failed"]))
    assert state == monitoring.UNKNOWN and "every window of the last 15 min failed: bpftrace exited with -9" in line


def test_damaged_or_foreign_records_are_left_out():
    good = recent([BUSY])
    # the last: this version's shape with findings no window has
    junk = [{"v": 99, "run": "x"}, "text", {**good[0], "findings": ["not a finding", {"no": "id"}]}]
    now = time.time()
    s = watchstatus.summarise(good + junk, now - 900, now)
    assert s["windows"] == 1 and [f["id"] for f in s["findings"]] == ["haproxy-maxconn"]
    assert s["findings"][0]["windows"] == 1


@pytest.mark.host  # the result envelope's host fingerprint runs systemd-detect-virt
def test_the_cli_status_as_text_json_and_nagios(sandbox, cli):
    r = cli("watch", "status", "--format", "nagios")
    assert r.exit_code == monitoring.UNKNOWN and "no watch window ended" in r.output
    with recorder.Recorder(sandbox.state_dir / "watch", 1 << 20) as ring:
        for rec in recent([HEALTHY, BUSY, "absent"]):
            assert ring.append(rec)
    r = cli("watch", "status")
    assert r.exit_code == 1, r.output
    assert "3 window(s): 2 watched, 1 absent, 0 failed" in r.output and "haproxy-maxconn  in 1 window(s)" in r.output
    r = cli("watch", "status", "--json")
    doc = json.loads(r.output)
    validate(doc)
    assert doc["kind"] == "watch-status" and doc["data"]["by_status"] == {"watched": 2, "absent": 1, "failed": 0}
    r = cli("watch", "status", "--format", "nagios", "--minutes", "60")
    assert r.exit_code == monitoring.CRITICAL and r.output.count("\n") == 1
    r = cli("watch", "status", "--minutes", "0")
    assert r.exit_code == 2 and "Traceback" not in r.output

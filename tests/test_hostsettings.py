"""Cooper's host settings as the report measures them: a Squid it starts in a private network
namespace, before and after the profile, changing nothing of the host."""

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import IS_ROOT

pytestmark = pytest.mark.skipif(not (IS_ROOT and shutil.which("wrk") and Path("/usr/sbin/squid").exists()
                                     and shutil.which("bpftrace")), reason="needs root, squid, wrk and bpftrace")


def test_before_and_after_in_a_namespace_the_host_never_sees(default_report):
    """The default report's Cooper section (run once for the suite: conftest.default_report)."""
    import json
    from proxytune.reports import seeds
    assert default_report.run.returncode == 0, default_report.run.stderr[-3000:]
    r = json.loads((default_report.out / "report.json").read_text())["data"]["sections"]["host_settings"]
    assert [s["label"] for s in r["stores"]] == ["warm-up (not counted)", "before", "after", "after", "before",
                                                 "before", "after"]
    # one Squid a side, kept: the before side's warm-up and 3 windows, the after side's 3, in the order run
    assert [(s["side"], s["window"]) for s in r["stores"]] == [("before", 1), ("before", 2), ("after", 1), ("after", 2),
                                                               ("before", 3), ("before", 4), ("after", 3)]
    # its cache holds the mix's repeated set in every window (at 32 MB a kept Squid fell to 0.15; the mix ~0.55)
    assert all(s["hit_ratio"] > 0.4 for s in r["stores"]), [s["hit_ratio"] for s in r["stores"]]
    # each cache was on a filesystem of its own, mounted in a private mount namespace: none is left here
    assert "proxytune-proxysides" not in Path("/proc/self/mountinfo").read_text()
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert "proxytune-proxysides" not in loops, loops
    assert all(s["cpus"] == [int(r["cpus"]["squid"])] for s in r["stores"])        # taskset reached Squid
    assert int(r["cpus"]["squid"]) not in r["cpus"]["load"]
    assert [bool((s.get("budget") or {}).get("parts")) for s in r["stores"]] == [True] + [False] * 6   # the warm-up
    assert all(s["service_ms"]["n"] > 0 for s in r["stores"])            # Squid's own clock, from its log
    assert 0 not in {i for p in r["rounds"] for i in p.values()}          # the warm-up is no pair's side
    assert [w["label"] for w in r["cpu_split"]["repeats"]] == ["before", "after", "after", "before", "before",
                                                               "after"]         # one CPU split per pair's run
    for s in r["stores"]:              # each window had its side's net.* values, read back in its namespace as it began
        want = r["sysctl_before"] if s["label"].startswith(("before", "warm-up")) else None
        assert (s["set_up"] == want) if want else all(s["set_up"][k] != r["sysctl_before"][k] for k in s["set_up"]), s
    assert r["sysctl_before"]
    share = {lab: sorted(s["capacity"]["served_share"] for s in r["stores"] if s["label"] == lab)
             for lab in ("before", "after")}
    assert share["before"][1] < share["after"][1], share       # 1,400 clients do not fit in 1,024 descriptors
    before, after = r["before"], r["after"]
    brief = {k: (before.get(k), after.get(k)) for k in ("nofile", "fd", "error_count")}
    assert before["nofile"][0] == 1024 and after["nofile"][0] > 4096, brief
    # Squid's own descriptor zones (microbench/proxybench.squid_fd_pressure): 1100 clients do not fit in 1024
    assert before["fd"]["pressure"] != "none" and after["fd"]["pressure"] == "none", brief
    assert any(a.startswith("net.") for a in r["applied"]), r["applied"]      # net.* written, in the namespace
    assert default_report.net_after == default_report.net_before             # ...and not here
    assert not list((default_report.root / "etc").rglob("*"))                 # no drop-in, no file
    state = default_report.state
    assert not state.exists() or not any(state.rglob("*journal*")), list(state.rglob("*"))   # no journal entry
    row = seeds.cooper(r)
    assert row["verdict"] != "not measurable here" and row["reps"] == 3 and "clients served" in row["today"], row
    assert "3 rounds of before and after alternating" in row["cells"], row
    split = r["cpu_split"]["evidence"]["loop"]["cpu_split"]
    assert abs(sum(split.values()) - 1) < 0.02 and split["kernel"] > 0 and split["proxy"] > 0, split
    assert seeds.cpu_split(r["cpu_split"])["today"].startswith("squid (ufs")

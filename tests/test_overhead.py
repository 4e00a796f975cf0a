"""`probe overhead`: the paired statistic on synthetic pairs (its interval,
its real coverage, its honest "noise" verdict), and what the doctor's
composed bpftrace program attaches to: only the tracepoints its findings
read, with cheap integer tests before any map lookup on host-wide events."""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import IS_ROOT, REPO
from proxytune.core import procgroup
from proxytune.probes import bpfstats, bpftrace, doctor, hostnoise, overhead, pairstats, syscost

needs_bpftrace = pytest.mark.skipif(not (IS_ROOT and shutil.which("bpftrace")), reason="needs root and bpftrace")


def test_interval_is_the_sign_test_order_statistics():
    ten = [0.05, -0.02, 0.01, 0.03, 0.00, 0.02, 0.04, -0.01, 0.015, 0.025]
    m = pairstats.median_ci(ten)
    s = sorted(ten)
    assert m["n"] == 10 and m["median"] == pytest.approx((s[4] + s[5]) / 2)
    assert m["ci"] == [s[1], s[8]]                              # k = 2: P = 1 - 2 * 11/1024
    assert m["confidence"] == pytest.approx(1 - 2 * 11 / 1024)


def test_too_few_pairs_report_their_real_coverage_not_95():
    m = pairstats.median_ci([0.03, 0.01, 0.02, 0.05, 0.04])
    assert m["ci"] == [0.01, 0.05]
    assert m["confidence"] == pytest.approx(1 - 2 / 32)        # 93.75 %, said as such
    assert pairstats.median_ci([0.02])["confidence"] == 0.0    # one pair: no interval at all
    assert pairstats.summarise([4.0], [4.4])["verdict"].startswith("too few pairs")
    two = pairstats.summarise([4.0, 4.0], [4.4, 4.1])       # a 50 % interval is no claim of a cost
    assert two["verdict"] == "too few pairs for an interval (50% coverage): run 5 or more --reps"
    four = pairstats.summarise([4.0] * 4, [4.4, 4.1, 4.2, 4.3])
    assert four["verdict"].startswith("too few pairs for an interval (88% coverage)")


def test_interval_covers_the_true_median_as_often_as_it_claims():
    rng = random.Random(7)
    for n in (6, 10, 15):
        hits, trials = 0, 2000
        claimed = pairstats.median_ci([0.0] * n)["confidence"]
        for _ in range(trials):
            xs = [0.01 + rng.gauss(0, 0.05) for _ in range(n)]     # true median +1 %
            lo, hi = pairstats.median_ci(xs)["ci"]
            hits += lo <= 0.01 <= hi
        assert claimed >= 0.95
        assert hits / trials >= claimed - 0.02, (n, hits / trials, claimed)


def test_an_interval_that_includes_zero_is_called_noise():
    noisy = pairstats.summarise([4.0] * 8, [4.0 * (1 + d) for d in (0.06, -0.05, 0.02, -0.03, 0.04, -0.01, 0.0, 0.01)])
    assert noisy["verdict"].startswith("not separable from noise")
    assert noisy["overhead_ci"][0] < 0 < noisy["overhead_ci"][1]
    assert not noisy["goal"]["met"]                              # one pair above +5 %
    real = pairstats.summarise([4.0] * 8, [4.0 * (1 + d) for d in (0.03, 0.04, 0.02, 0.035, 0.03, 0.025, 0.04, 0.03)])
    assert real["verdict"].startswith("costs") and real["overhead_ci"][0] > 0
    assert not real["goal"]["met"] and real["overhead"] == pytest.approx(0.03)
    cheap = pairstats.summarise([4.0] * 8, [4.0 * (1 + d) for d in (0.01, 0.0, 0.018, -0.01, 0.01, 0.015, 0.0, 0.01)])
    assert cheap["goal"]["met"] and cheap["goal"]["median_upper_bound_met"]


def test_pairs_with_a_missing_measurement_are_dropped_not_counted_as_zero():
    assert pairstats.pair_ratios([4.0, 0.0, 4.0], [4.4, 4.0, None]) == [pytest.approx(0.1)]


def _tracepoints(program: str) -> set[str]:
    return set(re.findall(r"tracepoint:(\w+:\w+)", program))


def test_the_doctor_attaches_only_the_syscalls_its_findings_read():
    """Default scripts trace no syscall; the triaged ones trace only the calls their findings read."""
    cat = bpftrace.catalog()
    every = {"pids": [101, 202], "ports": ["8080"], "netns": 1}
    tps = _tracepoints(bpftrace.compose([cat[n] for n in doctor.DEFAULT_SCRIPTS + doctor.TRIAGED_SCRIPTS], [101, 202],
                                        {n: every for n in doctor.PORT_SCRIPTS}))
    assert not any(t.startswith("raw_syscalls:") for t in tps)     # never every syscall of every task
    syscalls = {t.split(":sys_", 1)[1].split("_", 1)[1] for t in tps if t.startswith("syscalls:")}
    assert syscalls == {"poll", "ppoll", "select", "pselect6", "openat", "socket", "accept", "accept4",
                        "fsync", "fdatasync"}
    # origin_wait's per-packet pair, triaged too (only where sampled upstream sockets are ambiguous)
    assert tps - {t for t in tps if t.startswith("syscalls:")} == {
        "sched:sched_switch", "sock:inet_sock_set_state", "ext4:ext4_allocate_inode", "ext4:ext4_unlink_enter",
        "sock:sock_send_length", "tcp:tcp_probe"}
    default = _tracepoints(bpftrace.compose([cat[n] for n in doctor.DEFAULT_SCRIPTS], [101, 202]))
    assert not {"sock:sock_send_length", "tcp:tcp_probe"} & default       # never per packet by default


def test_host_wide_events_run_one_program_that_tests_integers_before_any_map():
    """sched_switch fires for every task on the host: one program runs there (not one per
    block), and it compares the record's ids (not a helper's) with the target's before it touches a map."""
    cat = bpftrace.catalog()
    prog = bpftrace.compose([cat[n] for n in doctor.DEFAULT_SCRIPTS], [101, 202])
    assert prog.count("tracepoint:sched:sched_switch") == 1
    block = prog.split("tracepoint:sched:sched_switch", 1)[1].split("\n}\n", 1)[0]
    conds = re.findall(r"^  if \((.*)\) \{", block, re.M)
    assert len(conds) == 2
    assert conds[0].startswith("(args->prev_pid == 101 || args->prev_pid == 202) && ")
    assert conds[1] == "(args->next_pid == 101 || args->next_pid == 202)"
    before_first_if = block.split("  if (", 1)[0]
    assert "@" not in before_first_if
    assert not re.search(r"(?<![>_])\b(tid|pid)\b", block)       # ids from the record, not by a helper call


def test_compose_rewrites_tracepoint_fields_compared_with_the_pid():
    cat = bpftrace.catalog()
    prog = bpftrace.compose([cat["loop_blocking"]], [7])
    assert "$1" not in prog and "if (args->next_pid == 7)" in prog and "args->prev_pid == 7 &&" in prog


@needs_bpftrace
def test_the_composed_program_attaches_exactly_those_probes(tmp_path):
    cat = bpftrace.catalog()
    prog = bpftrace.compose([cat[n] for n in doctor.DEFAULT_SCRIPTS], [1])
    f = tmp_path / "doctor.bt"
    f.write_text(prog)
    p = subprocess.run(["timeout", "-s", "INT", "-k", "20", "4", "bpftrace", "-f", "json", str(f)],
                       capture_output=True, text=True)
    m = re.search(r'"attached_probes".*?"probes":\s*(\d+)', p.stdout)
    assert m, bpftrace._clean(p.stderr)
    n_probes = len(re.findall(r"tracepoint:\w+:\w+", prog)) + ("END {" in prog)
    assert int(m.group(1)) == n_probes


def test_unknown_component_is_one_line_and_exit_2():
    p = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "probe", "overhead", "--component",
                        "nope;rm"], capture_output=True, text=True)
    if not IS_ROOT:
        pytest.skip("the root check comes first")
    assert p.returncode == 2 and p.stderr.startswith("proxytune: error: unknown --component 'nope;rm'")
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 2


def _blocks(pairs):
    out = []
    for i, ((sc0, sw0), (sc1, sw1)) in enumerate(pairs):
        out += [{"rep": i, "mode": "off", "syscall": sc0, "switch": sw0},
                {"rep": i, "mode": "on", "syscall": sc1, "switch": sw1}]
    return out


def test_unit_costs_are_pair_differences_and_a_switch_is_the_round_trip_less_four_syscalls():
    blocks = _blocks([((50, 2000), (56, 2420)), ((52, 2010), (57, 2400)), ((49, 1990), (55, 2410)),
                      ((51, 2005), (57, 2425)), ((50, 1995), (56, 2405)), ((50, 2000), (56, 2415))])
    u = syscost.summarise(blocks)
    assert u["syscall"]["added_ns"] == 6 and u["syscall"]["pairs"] == 6
    assert u["switch"]["added_ns"] == pytest.approx(417.5)         # median of 420, 390, 420, 420, 410, 415
    assert u["context_switch"]["added_ns"] == pytest.approx((417.5 - 4 * 6) / 2)
    lo, hi = u["context_switch"]["added_ns_ci"]
    assert lo <= u["context_switch"]["added_ns"] <= hi


def test_a_connection_is_the_loopback_connect_unit_less_its_six_syscalls_and_counts_per_accepted_connection():
    blocks = _blocks([((50, 2000), (56, 2420))] * 4)
    for i, b in enumerate(blocks):
        b["connect"] = 50_000 if b["mode"] == "off" else 50_600 + (i % 3)
    u = syscost.summarise(blocks)
    assert u["connection"]["added_ns"] == pytest.approx(u["connect"]["added_ns"] - 6 * 6)
    m = syscost.model(u, {"syscall": 2.0, "context_switch": 0.0, "connection": 0.5}, cpu_us_per_request=10.0)
    assert m["added_ns_per_request"]["connection"] == pytest.approx(0.5 * u["connection"]["added_ns"])
    old = syscost.summarise(_blocks([((50, 2000), (56, 2420))] * 4))          # blocks of a result before the unit
    assert "connection" not in old and "connection" not in syscost.model(old, {"connection": 1.0}, 10.0)[
        "added_ns_per_request"]


def test_a_tcp_exchange_is_the_loopback_round_trip_less_the_pipe_round_trip():
    blocks = _blocks([((50, 2000), (56, 2420))] * 4)
    for b in blocks:
        b["exchange"] = 5000 if b["mode"] == "off" else 5900
    u = syscost.summarise(blocks)
    assert u["tcp_exchange"]["added_ns"] == pytest.approx(900 - 420)
    m = syscost.model(u, {"syscall": 2.0, "context_switch": 0.0, "tcp_exchange": 1.0}, cpu_us_per_request=10.0)
    assert m["added_ns_per_request"]["tcp_exchange"] == pytest.approx(480)
    # a component with no program on TCP's paths: the unit is measured, not charged to it (it is noise there)
    quiet = syscost.model(u, {"syscall": 2.0, "context_switch": 0.0, "tcp_exchange": 1.0}, 10.0,
                          tracepoints=["sched:sched_switch", "ext4:ext4_unlink_enter"])
    assert quiet["units_modelled"] == ["syscall", "context_switch"]
    assert syscost.relevant(["tcp:tcp_probe"]) == ["syscall", "context_switch", "tcp_exchange", "connection"]
    assert syscost.relevant(["sock:inet_sock_set_state"]) == ["syscall", "context_switch", "connection"]


def test_the_model_multiplies_unit_costs_by_what_nginx_does_per_request():
    units = {"syscall": {"added_ns": 5.0, "added_ns_ci": [4.0, 6.0]},
             "context_switch": {"added_ns": 100.0, "added_ns_ci": [50.0, 150.0]}}
    m = syscost.model(units, {"syscall": 2.0, "context_switch": 0.1}, cpu_us_per_request=2.0)
    assert m["added_ns_per_request"] == {"syscall": 10.0, "context_switch": 10.0}
    assert m["overhead"] == pytest.approx(20 / 2000)
    assert m["overhead_ci"] == [pytest.approx((8 + 5) / 2000), pytest.approx((12 + 15) / 2000)]
    unknown = syscost.model(units, {"syscall": 2.0, "context_switch": None}, cpu_us_per_request=2.0)
    assert unknown["added_ns_per_request"] == {"syscall": 10.0}      # a missing count is left out, not zero


def test_syscost_measures_positive_cpu_time_and_rejects_bad_arguments(tmp_path):
    exe = syscost.compile_into(tmp_path)
    for unit in ("syscall", "switch", "exchange", "connect"):
        p = subprocess.run([str(exe), unit, "2000", "3"], capture_output=True, text=True)
        doc = json.loads(p.stdout)
        assert p.returncode == 0 and doc["mode"] == unit and len(doc["ns"]) == 3
        assert all(v > 0 for v in doc["ns"])
    for bad in (["syscall", "0", "3"], ["fork", "10", "1"], ["syscall", "10"]):
        p = subprocess.run([str(exe), *bad], capture_output=True, text=True)
        assert p.returncode == 2 and p.stdout == "" and "syscost" in p.stderr


def test_pairs_run_while_a_foreign_tracer_ran_are_dropped_whole():
    rows = [{"rep": 0, "doctor": "off", "foreign_tracers": []}, {"rep": 0, "doctor": "on", "foreign_tracers": []},
            {"rep": 1, "doctor": "on", "foreign_tracers": [4242]}, {"rep": 1, "doctor": "off", "foreign_tracers": []}]
    assert [r["rep"] for r in pairstats.clean(rows, "doctor")] == [0, 0]
    assert pairstats.clean(rows[2:], "doctor") == []             # nothing clean: nothing to compare, not half a pair


def test_a_tracer_we_did_not_start_is_seen_and_our_own_is_not(tmp_path):
    """A binary named perf (GNU tail following a file named like perf's subcommand: its argv is
    what a real `perf record` shows in /proc)."""
    fake = tmp_path / "perf"
    shutil.copy("/usr/bin/tail", fake)
    for sub in ("record", "bench"):
        (tmp_path / sub).write_text("")
    start = lambda sub: int(subprocess.run(["sh", "-c", f"./perf {sub} -f >/dev/null 2>&1 & echo $!"],
                                           capture_output=True, text=True, cwd=tmp_path).stdout)
    theirs, bench = start("record"), start("bench")          # their parent shell has exited: not ours
    ours = subprocess.Popen([str(fake), "record", "-f"], cwd=tmp_path, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and theirs not in hostnoise.foreign_tracers():
            time.sleep(0.05)
        seen = hostnoise.foreign_tracers()
        assert theirs in seen and ours.pid not in seen and bench not in seen     # `perf bench` attaches nothing
    finally:
        os.kill(theirs, signal.SIGKILL)
        os.kill(bench, signal.SIGKILL)
        ours.kill()
        ours.wait()


def test_spoiled_pairs_are_retried_until_enough_are_clean_but_not_forever():
    spoiled = iter([True, False, False, False, True, True] + [False] * 10)      # one flag per run
    rows = overhead._interleaved(2, lambda mode: {"foreign_tracers": [9] if next(spoiled) else []}, None, "mode")
    assert [r["mode"] for r in rows] == ["off", "on", "on", "off"] * 2                # alternating order kept
    assert len(rows) == 8 and len(pairstats.clean(rows)) == 4                      # 4 pairs tried, 2 clean
    always = overhead._interleaved(2, lambda mode: {"foreign_tracers": [9]}, None, "mode")
    assert len(always) == 2 * overhead.ATTEMPTS * 2 and pairstats.clean(always) == []


@needs_bpftrace
def test_the_merged_sched_switch_program_still_times_the_loop_in_d_state():
    """A process writing and fsyncing in its main thread sleeps in D state: one program on
    sched_switch must still see those sleeps, as the two blocks it replaced did."""
    code = ("import os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)\n"
            "while True:\n"                  # until the test kills it: attaching may take long on a busy host
            "    os.pwrite(fd, b'x' * 65536, 0); os.fsync(fd)\n")      # one block rewritten: the file stays 64 KiB
    disk = Path(tempfile.mkdtemp(prefix="proxytune-test-dstate-", dir="/var/tmp"))    # /tmp may be tmpfs
    w = subprocess.Popen([sys.executable, "-c", code, str(disk / "data")])
    try:
        time.sleep(0.3)
        maps = bpftrace.run_for([bpftrace.catalog()["loop_blocking"], bpftrace.catalog()["sync_calls"]], [w.pid], 3)
    finally:
        w.kill()
        w.wait()
        shutil.rmtree(disk)
    assert maps.get("@sync_calls", 0) > 10
    assert maps.get("@dstate_sleeps", 0) > 10 and maps.get("@dstate_ns", 0) > 0, maps


@pytest.mark.skipif(not IS_ROOT, reason="raising priority needs root")
def test_the_experiment_priority_is_restored_on_every_way_out():
    before = os.getpriority(os.PRIO_PROCESS, 0)
    with pytest.raises(KeyboardInterrupt):
        with hostnoise.priority(before - 1) as in_effect:
            assert in_effect == before - 1
            raise KeyboardInterrupt
    assert os.getpriority(os.PRIO_PROCESS, 0) == before


def _overhead(*args):
    p = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "probe", "overhead", "--json", *args],
                       capture_output=True, text=True, timeout=300)
    if p.returncode == 2 and "another bpftrace or perf ran during every pair" in p.stderr:
        pytest.skip("another user's tracer ran throughout (a shared host, not this code)")
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)["data"]


@pytest.mark.skipif(not (IS_ROOT and shutil.which("wrk") and shutil.which("nginx")), reason="needs root, wrk, nginx")
def test_a_short_aa_run_measures_both_sides():
    d = _overhead("--seconds", "1", "--reps", "1", "--component", "none")
    assert [r["doctor"] for r in d["runs"][:2]] == ["off", "on"]
    runs = [r for r in d["runs"] if not r["foreign_tracers"]]
    assert {r["doctor"] for r in runs} == {"off", "on"}
    for r in runs:      # physics, not speed: a request costs nginx more than 0.1 us and less than 1 ms of CPU
        assert r["requests"] > 100 and 0.1 < r["cpu_us_per_request"] < 1000, r
    assert len(d["overhead_per_pair"]) == 1 and d["verdict"]


@needs_bpftrace
@pytest.mark.skipif(not (shutil.which("wrk") and shutil.which("nginx") and shutil.which("perf")),
                    reason="needs wrk, nginx, perf")
def test_mechanisms_model_nginx_per_request_from_unit_costs():
    d = _overhead("--seconds", "1", "--reps", "1", "--component", "none", "--mechanisms")
    m = d["mechanisms"]
    assert 0.5 < m["nginx_per_request"]["syscall"] < 50, m["nginx_per_request"]
    assert m["nginx_alone"]["requests"] > 100 and "overhead" in m["model"]


def test_bpf_stats_are_switched_on_for_the_body_and_restored_on_every_way_out():
    if not IS_ROOT:
        pytest.skip("kernel.bpf_stats_enabled is writable by root only")
    before = bpfstats.SYSCTL.read_text().strip()
    try:
        bpfstats.SYSCTL.write_text("0\n")
        with pytest.raises(KeyboardInterrupt):
            with bpfstats.enabled() as why_not:
                assert why_not is None and bpfstats.SYSCTL.read_text().strip() == "1"
                raise KeyboardInterrupt
        assert bpfstats.SYSCTL.read_text().strip() == "0"
    finally:
        bpfstats.SYSCTL.write_text(before + "\n")


def test_bpf_stats_unreadable_sysctl_is_unavailable_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(bpfstats, "SYSCTL", tmp_path / "absent")
    with bpfstats.enabled() as why_not:
        assert why_not and "not readable" in why_not


@needs_bpftrace
def test_each_program_is_named_by_its_tracepoint_and_counts_the_runs_it_made(tmp_path):
    """getppid from this process, N times: the program on sys_enter_getppid ran at least N times
    (other tasks' getppid add to it: the pid filter runs inside the program), with a positive time."""
    prog = (f"tracepoint:syscalls:sys_enter_getppid /pid == {os.getpid()}/ {{ @n = count(); }}\n"
            "tracepoint:syscalls:sys_exit_fsync /pid == 1/ { @m = count(); }\n")
    before = bpfstats.SYSCTL.read_text().strip()
    with procgroup.Children() as kids:
        run = bpftrace.Run(kids, prog)
        run.wait_attached()
        with bpfstats.enabled() as why_not:
            assert why_not is None
            first = bpfstats.wait_attached(run.proc.pid, 2)
            for _ in range(5000):
                os.getppid()
            last = bpfstats.programs(run.proc.pid)
        maps = run.stop()
    assert maps.get("@n", 0) >= 5000
    assert bpfstats.SYSCTL.read_text().strip() == before
    rows = {r["attached"]: r for r in bpfstats.rates(first, last, 1.0)}
    assert set(rows) == {"tracepoint sys_enter_getppid", "tracepoint sys_exit_fsync"}, rows
    assert rows["tracepoint sys_enter_getppid"]["runs"] >= 5000
    assert rows["tracepoint sys_enter_getppid"]["ns_per_run"] > 0


WORKLOAD = """
import os, resource, select, socket, sys, time
d = sys.argv[1]
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(16)
port = srv.getsockname()[1]
closed = socket.socket(); closed.bind(("127.0.0.1", 0)); dead = closed.getsockname()[1]; closed.close()
while True:                # until the test kills it: attaching may take long on a busy host
    for i in range(10):
        p = os.path.join(d, f"obj{i}")
        fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o600)
        os.write(fd, b"x" * 65536); os.fsync(fd); os.close(fd); os.unlink(p)
    c = socket.socket(); c.connect(("127.0.0.1", port)); a, _ = srv.accept(); a.close(); c.close()
    c = socket.socket()
    try:
        c.connect(("127.0.0.1", dead))
    except OSError:
        pass
    c.close()
    r, w = os.pipe(); pl = select.poll(); pl.register(r, select.POLLIN); pl.register(w, select.POLLOUT)
    pl.poll(0); os.close(r); os.close(w)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))
    try:
        os.open("/dev/null", os.O_RDONLY)
    except OSError:
        pass
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
"""


@needs_bpftrace
def test_the_composed_doctor_program_still_fills_every_map_the_rules_read():
    """One small process that creates, fsyncs and unlinks files, accepts, connects (and is refused),
    polls and hits EMFILE: the doctor's program, composed as the doctor composes it, fills every map
    findings.py and doctor.loop_summary read, with the meaning they read."""
    disk = Path(tempfile.mkdtemp(prefix="proxytune-test-maps-", dir="/var/tmp"))      # /tmp may be tmpfs
    w = subprocess.Popen([sys.executable, "-c", WORKLOAD, str(disk)])
    try:
        time.sleep(0.3)
        scripts = doctor.usable_scripts(deep=True)[0]
        # a port no socket has, as compose() gave them without ports: no map this test reads depends on it
        maps = bpftrace.run_for(scripts, [w.pid], 3, {n: {"pids": [w.pid], "ports": ["1"], "netns": 0}
                                                      for n in doctor.PORT_SCRIPTS})
    finally:
        w.kill()
        w.wait()
        shutil.rmtree(disk)
    for key in ("@file_open", "@file_create", "@file_unlink", "@file_close", "@fdok_accept", "@poll_calls",
                "@poll_nfds", "@poll_ready", "@poll_ns", "@sync_calls", "@sync_ns", "@dstate_sleeps", "@dstate_ns"):
        assert maps.get(key, 0) > 0, (key, maps)
    assert maps["@file_create"] <= maps["@file_open"] and maps["@poll_nfds"] >= 2 * maps["@poll_calls"]
    assert any(k.startswith(str(disk)[:20]) for k in maps["@file_prefix"]), maps["@file_prefix"]
    conn = {int(k): v for k, v in maps["@conn"].items()}
    assert conn.get(0, 0) > 0 and conn.get(111, 0) > 0, conn                    # success and ECONNREFUSED
    # the same connects at the socket-state tracepoint, none of them short of a port (a refused connect
    # had its port); bpftrace attaches its probes one by one over a second or so, so the counts of two
    # probes cover slightly different spans: half is the margin. The creates and unlinks at ext4 likewise.
    assert maps.get("@conn_tries", 0) >= (conn[0] + conn[111]) / 2 and maps.get("@conn_noport", 0) == 0, maps
    assert maps.get("@fs_create", 0) > 0 and maps.get("@fs_unlink", 0) > 0, maps
    assert any(k.startswith("tracepoint:syscalls:sys_exit_openat") and k.endswith("24") for k in maps["@fderr"])


@pytest.mark.host  # reads /sys/kernel/tracing (root) (the tier: tests/tiers.py)
def test_the_doctor_attaches_no_syscall_tracepoint_unless_its_triage_needs_one():
    """Any syscalls:* tracepoint puts every task's syscalls on the kernel's slow path (+58-65 ns each
    here, about 2 % of an nginx request), so the default program has none; each syscall script comes
    only with the triage's reason for it, or with --deep."""
    def tracepoints(need):
        return {tp for s in doctor.usable_scripts(need=need)[0] for tp in s.tracepoints}
    quiet = {n: {"attach": False} for n in doctor.TRIAGED_SCRIPTS}
    assert not {tp for tp in tracepoints(quiet) if tp.split(":")[0] in ("syscalls", "raw_syscalls")}
    assert {"sched:sched_switch", "sock:inet_sock_set_state"} <= tracepoints(quiet)
    polling = {**quiet, "pollscan": {"attach": True}}
    assert {tp for tp in tracepoints(polling) if tp.startswith("syscalls:")} == {
        f"syscalls:sys_{side}_{call}" for side in ("enter", "exit") for call in ("poll", "ppoll", "select", "pselect6")}

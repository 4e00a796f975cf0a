"""The time budget and its findings over evidence written out here, shape by
shape (pure: no root, no proxy): what each part reads, Little's law's
arithmetic, the proxy's own upstream time corrected by the kernel's view of
its loop, the dominant part, the four rules and their ranking among the
other findings, and the old recorded evidence that has no budget inputs."""

import json
import os
import statistics
import types
from pathlib import Path

import pytest

from proxytune import proxies as kinds
from proxytune.core.errors import ProxytuneError
from proxytune.probes import budget, budget_findings, bpftrace, doctor, inflight
from proxytune.probes.findings import Finding


W = 3.0
TICKS = 12


def evidence(rate=300, awaiting=0.0, unread_up=0.0, unread_client=0.0, accept=0.0, connects=None, cpu_s=0.03,
             delay_s=0.0, busiest=0.05, kind=None, timing=None):
    """One window's evidence: `rate` requests/s counted by the kernel, and the mean number of the proxy's
    sockets found in each state at the ticks."""
    n = int(rate * W)
    b = {"@bt_acc": {"8080": 0}}
    if connects:
        count, ms = connects
        b["@bt_conn_ns"] = {"127.0.0.1,9000": {"count": count, "average": ms * 1e6, "total": count * ms * 1e6}}
    flight = {"ticks": TICKS, "accept_queued_sum": {"8080": accept * TICKS}, "client_unread_sum": unread_client * TICKS,
              "origins": {"127.0.0.1:9000": {"connecting": 0, "awaiting": awaiting * TICKS, "unread": unread_up * TICKS,
                                             "sockets": 50 * TICKS}},
              "awaiting_in_one_jiffy": 0,
              "clients": {"data_segments_in": n, "sockets_seen": 50, "sockets_born_in_window": 0}}
    sched = {"available": True, "run_ns": int(cpu_s * 1e9), "run_delay_ns": int(delay_s * 1e9), "slices": 100,
             "busiest_thread": {"pid": 10, "tid": 10, "comm": "proxy", "cpu_share": busiest, "run_delay_share": 0.0}}
    proxy = {"kind": kind, "timing": timing, "directives": {}} if kind else None
    return {"window_s": W, "bpf_window_s": W, "bpf": b, "scripts": ["budget"], "skipped_scripts": {},
            "conns": {"flight": flight}, "sched": sched, "proxy": proxy}


def test_littles_law_turns_sampled_counts_into_milliseconds_per_request():
    b = budget.compute(evidence(rate=300, awaiting=100))
    fb = b["parts"]["origin_first_byte"]
    assert fb["ms"] == pytest.approx(100 / 300 * 1000, rel=1e-3)             # L / λ
    assert fb["by_origin"]["127.0.0.1:9000"]["mean_awaiting"] == 100
    assert fb["resolution_ms"] == pytest.approx(1000 / TICKS / 300, rel=1e-2)
    assert b["dominant"] == "origin_first_byte" and b["shares"]["origin_first_byte"] > 0.99
    assert b["requests"]["n"] == 900 and "kernel" in b["requests"]["source"]


def test_a_part_nothing_measured_is_not_measurable_with_a_reason_never_zero():
    ev = evidence()
    del ev["conns"]
    ev["scripts"], ev["skipped_scripts"] = [], {"budget": "tracepoints missing: sock:inet_sock_set_state"}
    b = budget.compute(ev)
    for name in ("accept_queue", "origin_connect", "origin_first_byte"):
        p = b["parts"][name]
        assert p["measurable"] is False and p["ms"] is None and p["why"], (name, p)
    assert "tracepoints missing" in b["parts"]["origin_connect"]["why"]
    assert b["parts"]["proxy_queue"]["measurable"] is False
    assert set(b["unmeasured"]) >= {"accept_queue", "proxy_queue", "origin_connect", "origin_first_byte"}


def test_connects_are_spread_over_the_requests_and_named_per_origin():
    b = budget.compute(evidence(rate=100, connects=(30, 2.0)))
    c = b["parts"]["origin_connect"]
    assert c["ms"] == pytest.approx(30 * 2.0 / 300, rel=1e-3)               # 30 connects of 2 ms over 300 requests
    assert c["by_origin"]["127.0.0.1:9000"] == {"ms": 2.0, "connects": 30}
    assert budget.origin_key("::1,443") == "[::1]:443"


def test_the_proxys_cpu_per_request_and_its_run_queue_wait_shown_but_not_added():
    b = budget.compute(evidence(rate=100, cpu_s=0.3, delay_s=0.6))
    s = b["parts"]["proxy_self"]
    assert s["split"]["cpu_ms"] == pytest.approx(1.0)                          # 0.3 s of CPU / 300 requests
    assert s["run_queue_ms"] == pytest.approx(2.0) and s["ms"] == pytest.approx(1.0)


class FakeKind:
    """A proxy module's pure side, as h-owntime's modules give it (budget-interface.md)."""
    parts: dict = {}
    total = None

    @classmethod
    def time_parts(cls, p):
        return {"parts": cls.parts, "proxy_total": cls.total, "requests": {"n": 900, "source": "its own counter"}}

    @staticmethod
    def origins(p):
        return {"127.0.0.1:9000": {"name": "backend app/server s1", "where": "/etc/haproxy/haproxy.cfg:12"}}


@pytest.fixture
def fake_kind(monkeypatch):
    FakeKind.parts, FakeKind.total = {}, None
    real = kinds.by_kind
    monkeypatch.setattr(kinds, "by_kind", lambda k: FakeKind if k == "fake" else real(k))
    return FakeKind


def own(ms, **more):
    return {"ms": ms, "measurable": True, "mechanism": "fake stats rtime", "precision": "1 ms", **more}


def test_the_proxys_own_origin_time_loses_what_its_loop_added(fake_kind):
    """The proxy measures the origin with its own loop: an answer that sat 200 ms unread in its socket is
    200 ms of its 300 ms. The kernel saw the unread data; the origin gets 100 ms, the proxy the rest."""
    fake_kind.parts = {"origin_first_byte": own(300.0, requests=900)}
    b = budget.compute(evidence(rate=300, awaiting=30, unread_up=60, kind="fake", timing={}))
    fb = b["parts"]["origin_first_byte"]
    assert fb["proxy_figure_ms"] == 300.0 and fb["loop_delay_taken_out_ms"] == pytest.approx(200, rel=1e-3)
    assert fb["ms"] == pytest.approx(100, rel=1e-3)
    assert fb["kernel_cross_check"]["ms"] == pytest.approx(100, rel=1e-3)       # L=30 at 300/s agrees
    assert b["parts"]["proxy_self"]["split"]["origin_data_unread_ms"] == pytest.approx(200, rel=1e-3)
    assert b["dominant"] == "proxy_self"
    assert b["requests"]["source"] == "its own counter"


def test_a_proxy_figure_over_some_requests_is_spread_over_the_window_and_the_total_checked(fake_kind):
    fake_kind.parts = {"origin_first_byte": own(200.0, requests=450)}
    fake_kind.total = own(110.0, requests=900)
    b = budget.compute(evidence(rate=300, kind="fake", timing={}))
    assert b["parts"]["origin_first_byte"]["ms"] == pytest.approx(100.0)     # half the requests went to the origin
    chk = b["checks"][0]
    assert chk["against"] == "proxy_total" and chk["agrees"] and chk["ratio"] == pytest.approx(b["total_ms"] / 110, rel=1e-3)


def test_no_timing_from_the_proxy_leaves_a_kernel_only_budget(fake_kind):
    fake_kind.parts = {"origin_first_byte": own(300.0)}
    b = budget.compute(evidence(rate=300, awaiting=3, kind="fake", timing=None))
    assert b["parts"]["origin_first_byte"]["ms"] == pytest.approx(10.0)        # the kernel's L / λ
    assert b["requests"]["source"].startswith("kernel")
    assert b["parts"]["origin_first_byte"]["by_origin"]["127.0.0.1:9000"]["name"] == "backend app/server s1"


# ---------------------------------------------------------------- rules

def doctor_answer(ev, found=()):
    b = budget.compute(ev)
    return b, budget_findings.rank(list(found), budget_findings.evaluate(ev, b, list(found)))


def ids(found):
    return [f.id for f in found]


def test_slow_origin_needs_the_origin_to_dominate_and_reach_the_floor(fake_kind):
    ev = evidence(rate=300, awaiting=90, kind="fake", timing=None)                # 300 ms per request
    b, found = doctor_answer(ev)
    assert ids(found) == ["slow-origin"]
    f = found[0]
    assert f.evidence["origins"][0]["origin"] == "127.0.0.1:9000"
    assert f.evidence["origins"][0]["name"] == "backend app/server s1"
    assert "will not help" in f.fix and "127.0.0.1:9000" in f.fix and "timeout" in f.fix and "reuse" in f.fix
    # a fast origin: the origin is still the largest part, but below TCP_DELACK_MIN: information only
    b, found = doctor_answer(evidence(rate=300, awaiting=0.6))                   # 2 ms
    assert b["dominant"] == "origin_first_byte" and not found


def test_a_healthy_fast_proxy_gets_no_budget_finding():
    for ev in (evidence(rate=40, awaiting=0.05, cpu_s=0.01), evidence(rate=4000, awaiting=1, unread_client=0.5,
                                                                    cpu_s=0.4, busiest=0.3)):
        b, found = doctor_answer(ev)
        assert not found, (b["parts"], ids(found))


def test_proxy_queue_names_its_directive_when_a_queue_formed(fake_kind):
    cause = {"directive": "server s1 127.0.0.1:9000 maxconn 4", "where": "/etc/haproxy/haproxy.cfg:12", "limit": 4,
             "queue_now": 40, "queue_max": 46, "what": "backend app, server s1"}
    fake_kind.parts = {"proxy_queue": own(900.0, cause=cause, requests=900)}
    b, found = doctor_answer(evidence(rate=300, awaiting=12, kind="fake", timing={}))
    assert ids(found) == ["proxy-queue"]
    f = found[0]
    assert f.evidence["where"] == "/etc/haproxy/haproxy.cfg:12" and f.evidence["queue_max"] == 46
    assert "maxconn 4" in f.title
    fake_kind.parts = {"proxy_queue": own(900.0, cause={**cause, "queue_now": 0, "queue_max": 0})}
    assert not doctor_answer(evidence(rate=300, kind="fake", timing={}))[1]


def test_accept_wait_ties_the_late_accept_to_a_blocked_loop_and_yields_to_an_own_cap():
    block = Finding("blocking-disk-io", "medium", "the event loop blocks on the disk 30% of the time", {},
                    "take disk waits off the loop", impact=0.3)
    ev = evidence(rate=100, accept=20)                                          # 200 ms in the accept queue
    b, found = doctor_answer(ev, [block])
    assert ids(found) == ["accept-wait", "blocking-disk-io"]
    assert "blocking-disk-io" in found[0].evidence["why"] and found[0].fix == block.fix
    cap = Finding("haproxy-maxconn", "high", "haproxy is at its global maxconn 50", {}, "raise maxconn",
                  impact=1e6)
    b, found = doctor_answer(ev, [cap])
    assert ids(found) == ["haproxy-maxconn"]
    assert found[0].evidence["accept_wait_ms_per_request"] == pytest.approx(200, rel=1e-3)


def test_proxy_cpu_needs_held_data_and_a_saturated_loop():
    ev = evidence(rate=1000, unread_client=100, cpu_s=2.7, busiest=0.97)       # 100 ms of unread data per request
    b, found = doctor_answer(ev)
    assert ids(found) == ["proxy-cpu"] and "97%" in found[0].title
    assert not doctor_answer(evidence(rate=1000, unread_client=100, cpu_s=0.3, busiest=0.2))[1]
    block = Finding("blocking-disk-io", "medium", "the event loop blocks on the disk", {}, "aio threads", impact=0.3)
    b, found = doctor_answer(evidence(rate=1000, unread_client=100, busiest=0.2), [block])
    assert ids(found)[0] == "loop-lag" and found[0].evidence["cause"]["finding"] == "blocking-disk-io"


def test_budget_findings_rank_by_time_lost_among_the_medium_ones_and_never_above_a_high_one():
    high = Finding("fd-exhaustion", "high", "", {}, "", impact=5)
    med = Finding("cpu-hotspot", "medium", "", {}, "", impact=0.4)
    low = Finding("cache-dir-atime", "low", "", {}, "", impact=0.1)
    new = Finding("slow-origin", "medium", "", {}, "", impact=300)
    assert ids(budget_findings.rank([high, med, low], [new])) == ["fd-exhaustion", "slow-origin", "cpu-hotspot",
                                                                   "cache-dir-atime"]


# ---------------------------------------------------------------- the kernel's inputs

def test_a_request_sent_answered_and_acknowledged_in_one_jiffy_is_ambiguous_and_bounds_the_origins_wait(fake_kind):
    """Squid and Traffic Server reuse origin connections: the next request leaves in the jiffy the last
    answer came, and an origin idle past its RTO acknowledges at once. TCP_INFO cannot tell that socket
    from one answered within the jiffy and idle since: the kernel bounds the wait, the proxy's own
    total (less its other parts) places it within the bounds."""
    tie = {"bytes_sent": 160, "bytes_received": 300, "lastsnd": 80, "lastrcv": 80, "lastack": 80}
    assert inflight.ambiguous(tie) and not inflight.awaiting(tie)
    assert not inflight.ambiguous({**tie, "lastack": 40}) and inflight.awaiting({**tie, "lastack": 40})
    ev = evidence(rate=300, awaiting=45)
    ev["conns"]["flight"]["origins"]["127.0.0.1:9000"]["ambiguous"] = 45 * TICKS
    b = budget.compute(ev)
    fb = b["parts"]["origin_first_byte"]
    assert fb["ms"] == pytest.approx(150) and fb["ms_upper"] == pytest.approx(300) and fb["at_least"]
    assert "between 150.0 and 300.0 ms" in fb["precision"]
    fake_kind.total = own(250.0, requests=900)                                  # the proxy's own total per request
    ev["proxy"] = {"kind": "fake", "timing": {}, "directives": {}}
    fb = budget.compute(ev)["parts"]["origin_first_byte"]
    assert fb["ms"] == pytest.approx(250.0 - 30 / 900, abs=0.01)               # less its CPU per request
    assert fb["kernel_lower_ms"] == pytest.approx(150) and "within the kernel's bounds" in fb["mechanism"]
    assert fb["by_origin"]["127.0.0.1:9000"]["ms"] == pytest.approx(fb["ms"], abs=0.01)
    fake_kind.total = own(900.0, requests=900)                                  # never past the kernel's upper bound
    assert budget.compute(ev)["parts"]["origin_first_byte"]["ms"] == pytest.approx(300)


def test_awaiting_the_origin_from_tcp_info_including_the_one_jiffy_case():
    # fresh connection: request sent, nothing received yet (ss leaves bytes_received out)
    assert inflight.awaiting({"bytes_sent": 80, "lastsnd": 120, "lastrcv": 124, "lastack": 120})
    # answered and idle in the pool: the last data came after the last send
    assert not inflight.awaiting({"bytes_sent": 80, "bytes_received": 300, "lastsnd": 900, "lastrcv": 896})
    # sent after the last answer
    assert inflight.awaiting({"bytes_sent": 160, "bytes_received": 300, "lastsnd": 40, "lastrcv": 60})
    # reused in the jiffy of the previous answer: unacknowledged, or acknowledged later by a delayed ACK
    assert inflight.awaiting({"bytes_sent": 160, "bytes_received": 300, "lastsnd": 8, "lastrcv": 8, "unacked": 1})
    assert inflight.awaiting({"bytes_sent": 160, "bytes_received": 300, "lastsnd": 80, "lastrcv": 80, "lastack": 40})
    # answered within the jiffy it was sent in (a fast origin): not awaiting
    assert not inflight.awaiting({"bytes_sent": 160, "bytes_received": 300, "lastsnd": 80, "lastrcv": 80,
                                  "lastack": 80})
    assert not inflight.awaiting({"bytes_received": 5})                         # never sent anything


def test_a_tick_sorts_the_proxys_sockets_into_the_budgets_states():
    t = inflight.Tally()
    rows = [("LISTEN", 3, 128, "8080", 1, "127.0.0.1>0.0.0.0:*", {}),
            ("ESTAB", 0, 0, "8080", 2, "127.0.0.1>127.0.0.1:5000", {"data_segs_in": 4, "lastsnd": 1, "lastrcv": 3}),
            ("ESTAB", 10, 0, "8080", 3, "127.0.0.1>127.0.0.1:5001", {"data_segs_in": 1}),
            ("SYN-SENT", 0, 1, "40000", 4, "127.0.0.1>127.0.0.1:9000", {}),
            ("ESTAB", 0, 0, "40001", 5, "127.0.0.1>127.0.0.1:9000", {"bytes_sent": 80, "lastsnd": 5, "lastrcv": 5}),
            ("ESTAB", 99, 0, "40002", 6, "127.0.0.1>127.0.0.1:9000", {"bytes_sent": 80, "bytes_received": 99}),
            ("ESTAB", 0, 0, "40003", 7, "127.0.0.1>[::ffff:10.0.0.9]:80", {"bytes_sent": 80, "bytes_received": 9,
                                                                          "lastsnd": 1, "lastrcv": 9}),
            ("ESTAB", 7, 0, "40004", 99, "127.0.0.1>127.0.0.1:9000", {})]          # not the proxy's socket
    owner = {i: [1] for i in range(1, 8)}
    t.tick([r[:6] for r in rows], owner, {"8080"}, {r[4]: r[6] for r in rows})
    s = t.summary()
    assert s["accept_queued_sum"] == {"8080": 3} and s["client_unread_sum"] == 1
    assert s["origins"]["127.0.0.1:9000"] == {"connecting": 1, "awaiting": 1, "ambiguous": 0, "unread": 1,
                                              "sockets": 2}
    assert s["origins"]["10.0.0.9:80"]["awaiting"] == 1
    t.tick([("ESTAB", 0, 0, "8080", 2, ""), ("ESTAB", 0, 0, "8080", 8, "")], {2: [1], 8: [1]}, {"8080"},
           {2: {"data_segs_in": 9}, 8: {"data_segs_in": 2}})
    assert t.summary()["clients"] == {"data_segments_in": 5 + 2, "sockets_seen": 3, "sockets_born_in_window": 1}
    assert t.summary()["client_unread_per_tick"] == [1, 0]


def test_tcp_rows_keeps_its_six_fields_and_hands_tcp_info_by_inode():
    from proxytune.core.tcpdiag import ALL_STATES, TCP_TIME_WAIT, Sock
    from proxytune.probes import connsample

    class Dumps:
        asked = []

        def dump(self, **how):
            self.asked.append(how)
            return [Sock("ESTAB", 0, 0, "127.0.0.1:40001", "127.0.0.1:9000", 5, {"bytes_sent": 80, "lastsnd": 5}),
                    Sock("LISTEN", 0, 128, "[::1]:8080", "[::]:*", 1, {}),
                    Sock("SYN-RECV", 0, 0, "127.0.0.1:8080", "127.0.0.1:50000", 0)]     # a request sock: no inode

    info, ns = {}, Dumps()
    rows = connsample.tcp_rows(ns, info=info)
    assert rows[0] == ("ESTAB", 0, 0, "40001", 5, "127.0.0.1>127.0.0.1:9000")
    assert rows[1] == ("LISTEN", 0, 128, "8080", 1, "[::1]>[::]:*") and rows[2][4] is None
    assert info == {5: {"bytes_sent": 80, "lastsnd": 5}, 1: {}}
    assert ns.asked[0] == {"states": ALL_STATES & ~(1 << TCP_TIME_WAIT), "info": True}
    connsample.tcp_rows(ns, time_wait=True)
    assert ns.asked[1] == {"states": ALL_STATES, "info": False}
    assert connsample.tcp_rows(None) == []                   # no namespace to read (the process was gone)


def test_compose_gives_the_budget_script_its_own_pids_ports_and_namespace():
    s = bpftrace.catalog()["budget"]
    text = bpftrace.compose([s], [10], {"budget": {"pids": [10, 11], "ports": ["80", "8080"], "netns": 4026531993}})
    assert "(pid == 10 || pid == 11)" in text
    assert "(args->sport == 80 || args->sport == 8080)" in text and "ns.inum == 4026531993" in text
    assert "$2" not in text and "$3" not in text
    alone = bpftrace.compose([s], [10])
    assert "args->sport == 0" in alone and "pid == 10" in alone


# ---------------------------------------------------------------- recorded evidence, rendering

PREBUDGET = Path(__file__).resolve().parent / "evidence" / "prebudget"


@pytest.mark.parametrize("path", sorted(PREBUDGET.glob("*.json")), ids=lambda p: p.stem)
def test_evidence_recorded_before_the_budget_replays_with_every_part_unmeasurable(path):
    """A doctor result saved before the budget existed (six own-cap looks of 2026-11-26, kept apart since the
    matrix's evidence is re-recorded with the budget's data) still replays: every part unmeasurable, never 0."""
    assert not [k for k in json.loads(path.read_text())["data"]["evidence"] if "budget" in k]
    doc = json.loads(path.read_text())
    r = doctor.answer(doc["data"]["evidence"], doc["data"]["target"]["pids"])
    b = r["budget"]
    assert b["total_ms"] == 0 and b["dominant"] is None and len(b["unmeasured"]) == 5
    assert not {"slow-origin", "proxy-queue", "accept-wait", "proxy-cpu", "loop-lag"} & set(ids(
        [Finding(**{k: f[k] for k in ("id", "severity", "title", "evidence", "fix")}) for f in r["findings"]]))


def test_rows_print_every_part_and_say_which_are_not_measurable():
    ev = evidence(rate=300, awaiting=90, connects=(900, 0.1))
    del ev["sched"]
    b = budget.compute(ev)
    rows = budget.rows(b)
    assert [r[0] for r in rows] == [budget.LABELS[n] for n in budget.PARTS]
    assert rows[1][1] == "not measurable here" and rows[1][3]
    assert "127.0.0.1:9000" in rows[3][3] and rows[3][2] == f"{b['shares']['origin_first_byte']:.0%}"
    assert "per request" in budget.headline(b) and "dominant: origin's first byte" in budget.headline(b)


def test_with_deep_every_read_is_traced_and_its_distribution_shown():
    ev = evidence(rate=100, unread_client=50, cpu_s=0.03)                      # sampled: 500 ms; traced wins
    ev["scripts"].append("budget_reads")
    ev["bpf"].update({"@br_cli_ns": {"count": 300, "average": 2e6, "total": 6e8},
                      "@br_cli_us": [{"min": 1024, "max": 2047, "count": 200}, {"min": 2048, "max": 4095, "count": 100}],
                      "@br_up_ns": {"count": 0, "average": 0, "total": 0}})
    s = budget.compute(ev)["parts"]["proxy_self"]
    assert s["split"]["client_data_unread_ms"] == pytest.approx(2.0)           # 600 ms over 300 requests
    assert s["per_read"]["cli"] == {"p50_ms": 2.047, "p99_ms": 4.095, "reads": 300}
    assert "tcp_rcv_space_adjust" in s["mechanism"] and s["resolution_ms"] is None


def test_a_thread_pool_using_every_cpu_is_proxy_cpu_though_no_thread_is_at_a_core():
    ev = evidence(rate=1000, unread_client=100, cpu_s=5.7, busiest=0.2)
    ev["sched"].update({"cpus": 2, "cpu_share_of_host": 0.95})
    f = doctor_answer(ev)[1]
    assert ids(f) == ["proxy-cpu"] and "95% of the host's 2 CPUs" in f[0].title


def test_a_doctor_run_in_a_report_shows_its_budget_escaped_in_markdown_and_html(fake_kind):
    from proxytune.reports import doctor as doctor_section, html, markdown
    FakeKind.origins = staticmethod(lambda p: {"127.0.0.1:9000": {"name": "app|<script>x</script>", "where": "a.cfg:3"}})
    try:
        b, found = doctor_answer(evidence(rate=300, awaiting=90, kind="fake", timing=None))
        r = {"target": {"pids": [10], "comm": "haproxy"}, "window_s": 3.0, "verdict": "limited",
             "findings": [f.to_json() for f in found], "budget": b, "headroom": []}
        sec = doctor_section.section(r)
    finally:
        FakeKind.origins = staticmethod(lambda p: {"127.0.0.1:9000": {"name": "backend app/server s1",
                                                                      "where": "/etc/haproxy/haproxy.cfg:12"}})
    titles = [t.title for t in sec.tables]
    assert titles == ["Findings, ranked", "Time budget of an average request"]
    assert sec.tables[0].rows[0][2].startswith("slow-origin")
    md, page = markdown.section(sec), html.section(sec)
    assert "app\\|&lt;script>" in md and "<script>" not in md
    assert "&lt;script&gt;" in page and "<script>" not in page
    assert "not measurable here" in md and "kernel: upstream sockets sampled" in md


def test_a_script_that_reads_a_kernel_struct_is_skipped_without_btf(monkeypatch, tmp_path):
    monkeypatch.setattr(bpftrace, "tracepoint_exists", lambda tp: True)
    cat = bpftrace.catalog()
    assert bpftrace.missing_tracepoints(cat["budget"]) == []
    monkeypatch.setattr(bpftrace, "BTF", tmp_path / "vmlinux")
    assert bpftrace.missing_tracepoints(cat["budget"]) == [f"kernel BTF ({tmp_path / 'vmlinux'})"]
    assert bpftrace.missing_tracepoints(cat["loop_blocking"]) == []           # reads no kernel struct


def test_prometheus_textfile_carries_the_budget_per_part_and_parses():
    from prometheus_client.parser import text_string_to_metric_families
    from proxytune.probes import render
    b, found = doctor_answer(evidence(rate=300, awaiting=90))
    r = {"target": {"pids": [10], "comm": "nginx"}, "window_s": 3.0, "findings": [f.to_json() for f in found],
         "budget": b}
    fams = {f.name: f for f in text_string_to_metric_families(render.doctor_prometheus(r, "linux/proxy"))}
    got = {s.labels["part"]: s.value for s in fams["proxytune_doctor_request_seconds"].samples}
    assert got["origin_first_byte"] == pytest.approx(0.3) and "proxy_queue" not in got


def test_a_proxy_figure_without_origins_is_split_as_the_kernel_saw_them_await(fake_kind):
    fake_kind.parts = {"origin_first_byte": own(300.0, requests=900)}
    b = budget.compute(evidence(rate=300, awaiting=60, kind="fake", timing={}))
    by = b["parts"]["origin_first_byte"]["by_origin"]
    assert list(by) == ["127.0.0.1:9000"] and by["127.0.0.1:9000"]["ms"] == pytest.approx(300.0)
    assert by["127.0.0.1:9000"]["name"] == "backend app/server s1"
    f = budget_findings.evaluate(evidence(rate=300, awaiting=60, kind="fake", timing={}), b, [])[0]
    assert "127.0.0.1:9000 (backend app/server s1" in f.title


def test_a_queue_before_the_request_is_read_is_added_once_not_also_as_unread_client_data(fake_kind):
    """Varnish: a session waits in the pool's queue before a worker reads its request, so the kernel sees the
    same wait as client data unread. 100 ms in the queue (its figure) and 120 ms of unread client data (the
    kernel's) are 100 ms of queue and 20 ms of the proxy's own, not 220 ms."""
    cause = {"directive": "thread_pool_max 10 x thread_pools 1", "where": "command line", "limit": 10,
             "queue_now": 9, "queue_max": 10, "what": "the worker pools' queue"}
    fake_kind.parts = {"proxy_queue": own(100.0, cause=cause, requests=900, overlap_ms=100.0,
                                          overlaps="proxy_self: client data not yet read")}
    b = budget.compute(evidence(rate=300, unread_client=36, kind="fake", timing={}))     # 36 / 300 = 120 ms
    s = b["parts"]["proxy_self"]
    assert s["overlap_taken_out_ms"] == pytest.approx(100.0)
    assert s["split"]["client_data_unread_ms"] == pytest.approx(20.0, abs=0.01)
    assert b["total_ms"] == pytest.approx(100.0 + s["ms"]) and s["ms"] < 21
    fake_kind.parts = {"proxy_queue": own(100.0, cause=cause, requests=900)}          # a queue after the read
    assert budget.compute(evidence(rate=300, unread_client=36, kind="fake", timing={}))["parts"]["proxy_self"][
        "split"]["client_data_unread_ms"] == pytest.approx(120.0, abs=0.01)


def test_a_queue_without_a_length_formed_when_requests_are_counted_waiting_in_it(fake_kind):
    """Traffic Server shows no queue length; the transactions of the window that waited in its per-origin
    queue say that it formed."""
    cause = {"directive": "CONFIG proxy.config.http.per_server.connection.max INT 4", "where": "records.config:9",
             "limit": 4, "queue_now": None, "queue_max": None, "waited": 0, "queue_mean": None}
    fake_kind.parts = {"proxy_queue": own(900.0, cause=cause, requests=900)}
    assert not doctor_answer(evidence(rate=300, awaiting=12, kind="fake", timing={}))[1]
    fake_kind.parts = {"proxy_queue": own(900.0, cause={**cause, "waited": 40, "queue_mean": 2.7}, requests=900)}
    assert ids(doctor_answer(evidence(rate=300, awaiting=12, kind="fake", timing={}))[1]) == ["proxy-queue"]


def test_a_queue_behind_the_proxys_own_cap_is_that_caps_finding_with_the_wait(fake_kind):
    """Varnish queues its sessions when its pool is at thread_pool_max, its own cap: the cap's finding (which
    ranks first, as every own cap does) carries the queue's wait, and no second finding says the same."""
    cause = {"directive": "thread_pool_max 10 x thread_pools 1, thread_queue_limit 20", "where": "command line",
             "limit": 10, "queue_now": 9, "queue_max": 10, "what": "the worker pools' queue"}
    fake_kind.parts = {"proxy_queue": own(300.0, cause=cause, requests=900)}
    cap = Finding("varnish-thread-pool", "medium", "varnish is at its worker threads 10: sessions wait",
                  {"cap": "thread_pool_max 10 (command line)", "limit": 10}, "raise thread_pool_max", impact=1e6)
    b, found = doctor_answer(evidence(rate=300, awaiting=30, kind="fake", timing={}), [cap])
    assert ids(found) == ["varnish-thread-pool"]
    assert found[0].evidence["queue_wait_ms_per_request"] == pytest.approx(300.0)
    assert found[0].evidence["queue"]["queue_max"] == 10
    # clients waiting to be accepted dominate (a pool with queued sessions does not run its acceptor): the cap's
    # finding still carries the queue's wait (CI cell varnish-queue-max10x1: accept queue 219 ms, queue 108 ms)
    ev = evidence(rate=300, awaiting=30, accept=200, kind="fake", timing={})
    cap.evidence.pop("queue_wait_ms_per_request")
    b, found = doctor_answer(ev, [cap])
    assert b["dominant"] == "accept_queue" and found[0].evidence["queue_wait_ms_per_request"] == pytest.approx(300.0)
    other = Finding("haproxy-maxconn", "high", "haproxy is at its global maxconn", {"cap": "`maxconn 200`"}, "x",
                    impact=1e6)
    fake_kind.parts = {"proxy_queue": own(300.0, cause={**cause, "directive": "server s1 127.0.0.1:9000 maxconn 4"},
                                          requests=900)}
    assert ids(doctor_answer(evidence(rate=300, awaiting=30, kind="fake", timing={}), [other])[1]) == [
        "haproxy-maxconn", "proxy-queue"]                    # another cap: the queue is a finding of its own


def test_unread_client_data_seen_in_bursts_states_how_well_its_mean_is_known():
    """The CI look of a fast varnish (2026-11-27): 6 sockets with unread requests over 9 ticks, two ticks
    that each fell into a burst of 3, gave 8.4 ms per request against wrk's 0.7 ms. The same sum spread
    over every tick is known well; in two bursts it is not, and the part says by how much."""
    def part(per_tick):
        ev = evidence(rate=79)
        ev["conns"]["flight"].update(ticks=len(per_tick), client_unread_sum=sum(per_tick),
                                     client_unread_per_tick=per_tick)
        return budget.compute(ev)["parts"]["proxy_self"]
    bursts, steady = part([0, 0, 3, 0, 0, 0, 3, 0, 0]), part([4] * 9)
    assert bursts["split"]["client_data_unread_ms"] == pytest.approx(6 / 9 / 79 * 1000, rel=1e-3)
    assert bursts["uncertainty_ms"] == pytest.approx(2 * statistics.stdev([0, 0, 3, 0, 0, 0, 3, 0, 0]) / 3 / 79 * 1000,
                                                     rel=1e-3)
    assert bursts["uncertainty_ms"] > bursts["split"]["client_data_unread_ms"] - 0.7      # wrk's mean is inside
    assert "uncertainty_ms" not in steady and "±" not in steady["precision"]            # no spread: known
    lc_doc = {"data": {"budget": {"total_ms": bursts["ms"], "parts": {"proxy_self": bursts}}}}
    assert matrix_agrees(lc_doc, 0.7)
    fresh = budget.compute(evidence(rate=79))["parts"]["proxy_self"]                   # older evidence: no list
    assert "uncertainty_ms" not in fresh


def matrix_agrees(doc: dict, client_ms: float) -> bool:
    import latency_cells
    return latency_cells.agreement(doc, client_ms)["agrees"]


def test_ambiguous_upstreams_traced_give_the_exact_wait_per_request_by_exchanges_in_the_window(fake_kind):
    """HAProxy reuses its origin connections within a jiffy of the last answer and the origin, quiet past
    its RTO, acknowledges at once: sampled, the wait is only bounded (CI cell haproxy-slow400-nostats:
    22-401 ms for a 400 ms origin). origin_wait.bt times each exchange; bpftrace's maps span more than the
    window, so the exchanges per request come from the window's ticks (segments out upstream / requests)."""
    ev = evidence(rate=40, awaiting=1)                                          # 120 requests, sampled: 25 ms
    ev["conns"]["flight"]["origins"]["127.0.0.1:9000"]["ambiguous"] = 15 * TICKS
    ev["scripts"].append("origin_wait")
    ev["bpf"].update({"@ow_ns": {"127.0.0.1,9000": {"count": 100, "average": 400e6, "total": 400e8}},
                      "@ow_us": [{"min": 262144, "max": 524287, "count": 100}], "@ow_starts": 144})
    ev["conns"]["flight"]["upstream"] = {"data_segments_out": 120, "sockets_seen": 16}
    fb = budget.compute(ev)["parts"]["origin_first_byte"]
    assert fb["ms"] == pytest.approx(400.0) and fb["exchanges_per_request"] == 1.0
    assert fb["by_origin"]["127.0.0.1:9000"]["mean_wait_ms"] == 400.0 and fb["p99_ms"] == pytest.approx(524.287)
    assert fb["kernel_sampled"]["ms"] == pytest.approx(25.0) and fb["kernel_sampled"]["ms_upper"] > 350
    assert "sock_send_length" in fb["mechanism"] and "120 data segments sent upstream for 120" in fb["mechanism"]
    ev["conns"]["flight"]["upstream"] = {"data_segments_out": 60, "sockets_seen": 16}    # half from the cache
    assert budget.compute(ev)["parts"]["origin_first_byte"]["ms"] == pytest.approx(200.0)
    ev["proxy"] = {"kind": "fake", "timing": {}, "directives": {}}    # its own count (900, its log's window):
    assert budget.compute(ev)["parts"]["origin_first_byte"]["ms"] == pytest.approx(200.0)   # the ticks' ratio
    ev["proxy"] = None
    assert budget.compute(ev)["parts"]["origin_first_byte"]["kernel_sampled"]["traced_within_bounds"]
    ev["conns"]["flight"]["upstream"] = {"data_segments_out": 60, "sockets_seen": 16, "sockets_born_in_window": 2}
    ev["bpf"]["@conn_tries"] = 62                        # 60 upstream connections opened and closed between ticks
    assert budget.compute(ev)["parts"]["origin_first_byte"]["ms"] == pytest.approx(400.0)
    del ev["bpf"]["@conn_tries"]
    del ev["conns"]["flight"]["upstream"]                                        # no ticks: the traced starts,
    ev["bpf_window_s"] = W * 1.2                                                 # over bpftrace's longer span
    fb = budget.compute(ev)["parts"]["origin_first_byte"]
    assert fb["ms"] == pytest.approx(400.0 * 144 / 1.2 / 120) and "144 exchanges traced" in fb["mechanism"]
    ev["bpf_window_s"] = W
    ev["bpf"]["@ow_ns"] = {"::ffff:127.0.0.1,9000": ev["bpf"]["@ow_ns"]["127.0.0.1,9000"]}   # a v6 socket, v4-mapped
    assert list(budget.compute(ev)["parts"]["origin_first_byte"]["by_origin"]) == ["127.0.0.1:9000"]
    ev["bpf"]["@ow_ns"] = {}                                                     # nothing answered: sampled
    assert budget.compute(ev)["parts"]["origin_first_byte"]["ms"] == pytest.approx(25.0)


def test_upstream_segments_count_from_the_first_tick_or_from_birth():
    t = inflight.Tally()
    up = lambda out: {"bytes_sent": 10, "bytes_received": 10, "data_segs_out": out, "lastsnd": 4, "lastrcv": 8}
    t.tick([("ESTAB", 0, 0, "40000", 7, "127.0.0.1>127.0.0.1:9000")], {7: [1]}, set(), {7: up(50)})
    t.tick([("ESTAB", 0, 0, "40000", 7, "127.0.0.1>127.0.0.1:9000"),
            ("ESTAB", 0, 0, "40001", 8, "127.0.0.1>127.0.0.1:9000")], {7: [1], 8: [1]}, set(), {7: up(53), 8: up(2)})
    assert t.summary()["upstream"] == {"data_segments_out": 5, "sockets_seen": 2, "sockets_born_in_window": 1}
    t.tick([("ESTAB", 0, 0, "8080", 9, "127.0.0.1>127.0.0.1:51000")], {9: [1]}, {"8080"}, {9: up(40)})
    assert t.summary()["upstream"]["data_segments_out"] == 5                   # a client socket is none of them


def test_compose_expands_a_variable_compared_with_the_listening_ports():
    s = bpftrace.catalog()["origin_wait"]
    text = bpftrace.compose([s], [10], {"origin_wait": {"pids": [10], "ports": ["80", "8080"], "netns": 1}})
    assert "!(($lport == 80 || $lport == 8080))" in text and "$2" not in text
    # without the ports every socket of the proxy would pass `!($lport == 0)`: refused, not composed
    with pytest.raises(ProxytuneError, match="needs the proxy's listening ports"):
        bpftrace.compose([s], [10])
    cat = bpftrace.catalog()
    for name, script in cat.items():                      # no `$2` left unsubstituted in any script
        assert "$2" not in bpftrace.compose([script], [10], {name: {"pids": [10], "ports": ["80"], "netns": 1}})


def test_a_script_reading_a_field_this_kernels_tracepoint_lacks_is_skipped_not_composed(monkeypatch, tmp_path):
    """tcp:tcp_probe gained skaddr in later kernels: bpftrace refuses a whole program for one missing field,
    and the doctor composes one program of every script, so the script goes, named with the field."""
    for tp, fields in {"sock/sock_send_length": "sk protocol ret", "tcp/tcp_probe": "sport dport family data_len",
                       "sock/inet_sock_set_state": "skaddr newstate"}.items():
        d = tmp_path / "events" / tp
        d.mkdir(parents=True)
        d.joinpath("format").write_text("format:\n" + "".join(f"\tfield:int {f};\toffset:0;\tsize:4;\n"
                                                                for f in fields.split()))
    monkeypatch.setattr(bpftrace, "TRACING", tmp_path)
    s = bpftrace.catalog()["origin_wait"]
    assert bpftrace.missing_tracepoints(s) == ["tcp:tcp_probe field skaddr"]
    (tmp_path / "events/tcp/tcp_probe/format").write_text("\tfield:const void * skaddr;\n\tfield:__u16 sport;\n"
                                                          "\tfield:__u16 dport;\n\tfield:__u16 family;\n"
                                                          "\tfield:__u16 data_len;\n")
    assert bpftrace.missing_tracepoints(s) == []


def test_origin_wait_leaves_without_ports_and_in_a_standing_session(monkeypatch):
    """Without a listening port (or with more than it tests) a client socket could pass as upstream; a
    watcher's standing session attaches nothing per packet."""
    import os
    from proxytune.probes import triage
    looked = []
    monkeypatch.setattr(triage, "decide", lambda pids, upstream_looks=True: looked.append(upstream_looks) or
                        {"need": {n: {"attach": True} for n in doctor.TRIAGED_SCRIPTS}})
    monkeypatch.setattr(doctor.caps, "require_tracefs", lambda: None)
    monkeypatch.setattr(doctor.bpftrace, "version", lambda: "v0.17.0")
    monkeypatch.setattr(doctor.bpftrace, "missing_tracepoints", lambda s: [])
    monkeypatch.setattr(doctor.proxies, "identify", lambda pid: None)
    monkeypatch.setattr(doctor.caps, "perf_sampling", lambda: doctor.no("test"))
    args = {"pids": [os.getpid()], "ports": ["8080"], "netns": 1, "truncated": False}
    monkeypatch.setattr(doctor, "script_args", lambda every: {n: args for n in doctor.PORT_SCRIPTS})
    names = lambda p: [s.name for s in p.scripts]
    assert "origin_wait" in names(doctor.Probes([os.getpid()], use_perf=False))
    p = doctor.Probes([os.getpid()], use_perf=False, standing=True)
    assert "origin_wait" not in names(p) and "standing" in p.skipped["origin_wait"]
    assert looked == [True, False]                          # refused: the triage makes no sock_diag looks
    args.update(ports=[])
    p = doctor.Probes([os.getpid()], use_perf=False)
    assert "origin_wait" not in names(p) and "no listening port" in p.skipped["origin_wait"]
    args.update(ports=["80"], truncated=True)
    assert "more than 64" in doctor.Probes([os.getpid()], use_perf=False).skipped["origin_wait"]
    args.update(truncated=False)                           # a proxy whose own clock times its requests

    class Watched:
        kind, worker_thread = "haproxy", None

        def __init__(self, unavailable):
            self.clock = types.SimpleNamespace(data={"unavailable": True} if unavailable else {})

        def timing(self):
            return self.clock

        def processes(self):
            return []
    monkeypatch.setattr(doctor.proxies, "audit_as", lambda w, ref, comm: (ref, None))
    monkeypatch.setattr(doctor, "proxy_cache_dirs", lambda w: [])
    monkeypatch.setattr(doctor.proxies, "identify", lambda pid: Watched(unavailable=False))
    p = doctor.Probes([os.getpid()], use_perf=False)
    assert "origin_wait" not in names(p) and "own clock" in p.skipped["origin_wait"]
    monkeypatch.setattr(doctor.proxies, "identify", lambda pid: Watched(unavailable=True))   # no stats socket
    assert "origin_wait" in names(doctor.Probes([os.getpid()], use_perf=False))


def test_the_triage_looks_at_upstream_sockets_only_and_says_when_it_could_not(monkeypatch):
    """One sock_diag look: the target's established sockets that are not on its listening ports and that
    TCP_INFO cannot place; a namespace that cannot be read is said, not taken as 'all placed'."""
    from proxytune.probes import connsample, triage
    tie = {"bytes_sent": 160, "bytes_received": 300, "lastsnd": 80, "lastrcv": 80, "lastack": 80}
    rows = [("LISTEN", 0, 128, "8080", 1, "0.0.0.0>0.0.0.0:*"), ("ESTAB", 0, 0, "8080", 2, "127.0.0.1>10.0.0.9:5000"),
            ("ESTAB", 0, 0, "41000", 3, "127.0.0.1>127.0.0.1:9000"), ("ESTAB", 0, 0, "41001", 4, "127.0.0.1>127.0.0.1:9000"),
            ("ESTAB", 0, 0, "41002", 5, "127.0.0.1>127.0.0.1:9000")]
    infos = {2: tie, 3: tie, 4: {**tie, "lastack": 40}, 5: tie}

    def fake_rows(ns, info=None):
        info.update(infos)
        return rows
    monkeypatch.setattr(connsample, "tcp_rows", fake_rows)
    monkeypatch.setattr(connsample, "fd_inventory", lambda pid: (5, {1, 2, 3, 4}))      # 5 is another process's
    assert triage.ambiguous_upstreams(object(), [10]) == 1          # 2 is a client, 4 awaits (delayed ACK)
    monkeypatch.setattr(connsample, "namespace_of", lambda pid: None)
    monkeypatch.setattr(triage, "waiting_in", lambda pid, tid, table: None)
    seen = triage.sample([os.getpid()])
    assert seen["ambiguous_upstreams"] is None
    monkeypatch.setattr(triage, "sample", lambda pids, upstream_looks=True: seen)
    assert "could not be read" in triage.decide([os.getpid()])["need"]["origin_wait"]["why"]


def test_the_triage_attaches_origin_wait_only_where_an_upstream_socket_was_ambiguous(monkeypatch):
    """Per packet, origin_wait.bt costs what a syscall tracepoint does: it comes with the triage's reason
    (an upstream socket sampling cannot place), never by default."""
    import os
    from proxytune.probes import triage
    seen = {"available": True, "waits": {}, "running": {}, "loop_in_sync": 0, "fds_max": {}}
    monkeypatch.setattr(triage, "sample", lambda pids, upstream_looks=True: {**seen, "ambiguous_upstreams": 0})
    need = triage.decide([os.getpid()])["need"]["origin_wait"]
    assert not need["attach"] and "placed" in need["why"]
    monkeypatch.setattr(triage, "sample", lambda pids, upstream_looks=True: {**seen, "ambiguous_upstreams": 3})
    need = triage.decide([os.getpid()])["need"]["origin_wait"]
    assert need["attach"] and need["why"].startswith("3 kept-alive upstream socket(s)")
    assert "origin_wait" not in doctor.DEFAULT_SCRIPTS and "origin_wait" in doctor.TRIAGED_SCRIPTS


def starving(through=7, last=None, rate=30, ticks=TICKS):
    """A Varnish pool at its cap (live, varnish-queue-max10x1): `through` connections seen in the accept queue
    at every tick, never accepted (inflight.Tally._unaccepted), `last` in it at the last tick."""
    ev = evidence(rate=rate, accept=through)
    ev["conns"]["flight"]["ticks"] = ticks
    ev["conns"]["flight"]["accept_queued_sum"] = {"8080": through * ticks}
    ev["conns"]["flight"]["unaccepted"] = {"through_every_tick": {"8080": through} if through else {},
                                           "at_last_tick": {"8080": through if last is None else last}}
    return ev


def test_connections_never_accepted_are_counted_apart_not_averaged_into_the_requests():
    b = budget.compute(starving(7))
    part = b["parts"]["accept_queue"]
    assert part["ms"] == 0 and part["starved"]["whole_window"] == 7 and part["by_port"]["8080"]["never_accepted"] == 7
    assert part["starved"]["little_ms"] == pytest.approx(7 / b["requests"]["per_s"] * 1000, rel=1e-3)
    assert "7 connection(s) waited in the accept queue the whole window" in budget.headline(b)
    # none through every tick (they were accepted, or came later): Little's law on all of the queue
    ev = starving(0, last=7)
    ev["conns"]["flight"]["accept_queued_sum"] = {"8080": 7 * TICKS}
    b = budget.compute(ev)
    assert "starved" not in b["parts"]["accept_queue"]
    assert b["parts"]["accept_queue"]["ms"] == pytest.approx(7 / b["requests"]["per_s"] * 1000, rel=1e-3)
    # part of the queue flows (a live worker beside a stopped one): only the stalled part is taken out
    ev = starving(5)
    ev["conns"]["flight"]["accept_queued_sum"] = {"8080": 8 * TICKS}
    b = budget.compute(ev)
    assert b["parts"]["accept_queue"]["ms"] == pytest.approx(3 / b["requests"]["per_s"] * 1000, rel=1e-3)
    assert "starved" not in budget.compute(starving(7, ticks=1))["parts"]["accept_queue"]    # one tick proves nothing
    # a stalled queue that also took new clients in the window, none accepted (nginx's worker stopped while
    # 10 connect a second: live, 59 through every tick, 30 more by the end): all of it out of the mean
    ev = starving(7, last=9)
    ev["conns"]["flight"]["unaccepted"]["at_last_tick_ticks"] = {"8080": 7 * TICKS + 2 * 3}
    ev["conns"]["flight"]["accept_queued_sum"] = {"8080": 7 * TICKS + 2 * 3}
    assert budget.compute(ev)["parts"]["accept_queue"]["ms"] == 0


def test_a_stalled_proxy_that_served_nothing_still_shows_its_clients_never_accepted():
    ev = starving(20, rate=0)
    ev["conns"]["flight"]["clients"]["data_segments_in"] = 0
    b, found = doctor_answer(ev)
    part = b["parts"]["accept_queue"]
    assert not part["measurable"] and part["starved"]["whole_window"] == 20
    assert ids(found) == ["accept-wait"] and "20 connection(s) waited" in found[0].title


def test_clients_never_accepted_go_to_the_own_cap_or_to_accept_wait():
    cap = Finding("varnish-thread-pool", "high", "varnish is at its worker threads", {}, "raise thread_pool_max",
                  impact=1e6)
    _, found = doctor_answer(starving(7), [cap])
    assert ids(found) == ["varnish-thread-pool"] and found[0].evidence["never_accepted"] == {"8080": 7}
    _, found = doctor_answer(starving(7))
    assert ids(found) == ["accept-wait"] and "never accepted" in found[0].title
    assert found[0].evidence["never_accepted"] == {"8080": 7} and 200 < found[0].impact < 250   # ms per request


def _tick(t, rows, listeners=(("LISTEN", 0, 128, "8080", 1, "0.0.0.0>0.0.0.0:*"),)):
    t.tick([*listeners, *rows], {1: [1], 2: [1]}, {"8080"}, {})


def test_a_connection_waiting_in_the_accept_queue_is_an_established_socket_no_process_holds():
    """Tracked by 4-tuple: one there at every tick waited through the window; one accepted (it gets an inode)
    or gone drops out; a socket on another server's address with the same port is not the proxy's."""
    t = inflight.Tally()
    q = lambda peer, local="127.0.0.1": ("ESTAB", 0, 0, "8080", None, f"{local}>127.0.0.1:{peer}")
    _tick(t, [q(5001), q(5002)])
    _tick(t, [q(5001), ("ESTAB", 0, 0, "8080", 2, "127.0.0.1>127.0.0.1:5002"), q(5003)])
    _tick(t, [q(5001), q(5003), q(5004)])
    s = t.summary()["unaccepted"]
    assert s == {"through_every_tick": {"8080": 1}, "at_last_tick": {"8080": 3}, "at_last_tick_ticks": {"8080": 3 + 2 + 1}}
    t = inflight.Tally()
    own = (("LISTEN", 0, 128, "8080", 1, "127.0.0.1>0.0.0.0:*"),)
    for _ in range(2):
        _tick(t, [q(5001), q(6001, local="127.0.0.2")], own)
    assert t.summary()["unaccepted"]["through_every_tick"] == {"8080": 1}


def test_a_dual_stack_listener_takes_its_v4_mapped_clients_into_its_queue():
    """tcp_rows spells v6 addresses in brackets: a [::] listener is a wildcard, [::ffff:a.b.c.d] is a.b.c.d."""
    for listener, child in (("[::]", "[::ffff:127.0.0.1]"), ("[::1]", "[::1]"), ("127.0.0.1", "[::ffff:127.0.0.1]")):
        t = inflight.Tally()
        for _ in range(2):
            _tick(t, [("ESTAB", 0, 0, "8080", None, f"{child}>[::1]:5001")],
                  (("LISTEN", 0, 128, "8080", 1, f"{listener}>[::]:*"),))
        assert t.summary()["unaccepted"]["through_every_tick"] == {"8080": 1}, (listener, child)

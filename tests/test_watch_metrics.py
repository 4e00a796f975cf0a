"""The watcher's metrics, judged by a consumer (prometheus_client's parser of the exposition format), and
its endpoint and textfile: what a scrape gets, what a refused address or directory says. Windows are the
doctor's answers to evidence the live matrix recorded from real proxies, replayed through doctor.answer."""

import json
import os
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import matrix
from test_watch_loop import Seq, Sessions
from conftest import NOBODY, needs_root
from proxytune.core.errors import ProxytuneError
from proxytune.probes import doctor, metricserver, recorder, watch, watchmetrics, windows

BUSY = "haproxy-busy-global50-stats"       # haproxy at its global maxconn


def replayed(cell: str) -> dict:
    data = json.loads((matrix.EVIDENCE / f"{cell}.json").read_text())["data"]
    ev = data["evidence"]
    return doctor.answer(ev, ev["pids"])


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_a_busy_window_gives_its_finding_its_caps_and_its_budget():
    r = replayed(BUSY)
    rec = windows.watched("r1", 4, 1_800_000_000.0, 1_800_000_010.0, r, "haproxy")
    fams = families(watchmetrics.text(rec, {"windows": {"watched": 5}, "episodes": 1, "dropped": 0, "cpu_s": 1.25}))
    found = {(s.labels["id"], s.labels["severity"]): s.value for s in fams["proxytune_watch_findings"].samples}
    assert found == {(f["id"], f["severity"]): 1 for f in r["findings"]} and ("haproxy-maxconn", "high") in found
    used = {s.labels["cap"]: s.value for s in fams["proxytune_watch_cap_used"].samples}
    limit = {s.labels["cap"]: s.value for s in fams["proxytune_watch_cap_limit"].samples}
    assert used.keys() == limit.keys() and any("maxconn" in c for c in used), used
    maxconn = next(c for c in used if "maxconn" in c)
    assert 0 < used[maxconn] <= limit[maxconn]
    parts = {s.labels["part"] for s in fams["proxytune_watch_request_seconds"].samples}
    measured = {k for k, p in r["budget"]["parts"].items() if p.get("measurable") and p.get("ms") is not None}
    assert parts == measured
    assert fams["proxytune_watch_windows"].samples[0].value == 5       # the parser drops _total from the name
    assert fams["proxytune_watch_episodes"].samples[0].value == 1
    assert fams["proxytune_watch_cpu_seconds"].samples[0].value == 1.25
    assert fams["proxytune_watch_last_window_end_timestamp_seconds"].samples[0].value == 1_800_000_010.0


def test_cap_labels_stay_the_same_when_pids_and_threads_change():
    """The cap label was the headroom row's text, with a pid and a tid in it: a new series whenever the
    busiest thread or a worker changed (a reload, every window). Now a stable key, one series per cap;
    several workers' fds are one series, the one nearest its limit."""
    r = replayed(BUSY)
    ev = r["evidence"]
    labels = []
    for pid, tid in ((ev["pids"][0], 11), (ev["pids"][0] + 100, 12)):
        rows = [{"what": f"fds of pid {pid} (haproxy)", "key": "fds of a process", "used": 10, "limit": 100},
                {"what": f"fds of pid {pid + 1} (haproxy)", "key": "fds of a process", "used": 90, "limit": 100},
                {"what": f"CPU of its busiest thread (haproxy, pid {pid} tid {tid}), in cores",
                 "key": "CPU of its busiest thread, in cores", "used": 0.5, "limit": 1}]
        rec = windows.watched("r1", 1, 1.0, 2.0, {**r, "headroom": rows}, "haproxy")
        used = {s.labels["cap"]: s.value for s in families(watchmetrics.text(rec, {}))["proxytune_watch_cap_used"].samples}
        assert used == {"fds of a process": 90, "CPU of its busiest thread, in cores": 0.5}, used
        labels.append(set(used))
    assert labels[0] == labels[1]
    # and the doctor's own rows carry such keys: none of them holds a pid
    keys = [row.get("key") for row in r["headroom"]]
    assert all(keys) and not any("pid" in k for k in keys), r["headroom"]


def test_an_absent_proxy_s_window_has_no_findings_and_a_hostile_cap_name_stays_one_label():
    rec = windows.unwatched("r1", 0, 1.0, 2.0, windows.ABSENT, "no haproxy running", "haproxy")
    fams = families(watchmetrics.text(rec, {"windows": {"absent": 1}}))
    assert fams["proxytune_watch_findings"].samples == []
    r = replayed(BUSY)
    r["headroom"] = [{"what": 'fds of pid 7 (evil"\nproxy_x 1)', "used": 3, "limit": 9}]
    rec = windows.watched("r1", 1, 1.0, 2.0, r, "haproxy")
    fams = families(watchmetrics.text(rec, {}))
    assert [s.labels["cap"] for s in fams["proxytune_watch_cap_used"].samples] == ['fds of pid 7 (evil"\nproxy_x 1)']
    assert "proxy_x" not in fams


def test_the_loop_publishes_after_every_window_and_a_failing_consumer_is_said_once(tmp_path, monkeypatch):
    import time
    monkeypatch.setattr(time, "sleep", lambda s: None)
    r = replayed(BUSY)
    texts, said = [], []

    def refused(text):
        raise ProxytuneError("refusing to write /x/y: its directory is not root's")
    with recorder.Recorder(tmp_path / "ring", 1 << 20) as ring:
        loop = watch.Loop(ring, Seq([([10], None)] * 3), 1.0, say=said.append, open_session=Sessions(lambda p: r),
                          publish=[texts.append, refused])
        loop.forever(windows_max=3)
    assert len(texts) == 3
    last = families(texts[-1])
    assert last["proxytune_watch_windows"].samples[0].value == 3 and last["proxytune_watch_episodes"].samples[0].value == 1
    assert [s for s in said if "metrics not written" in s] == [
        "metrics not written: refusing to write /x/y: its directory is not root's; still watching"]


@pytest.mark.parametrize("given,want", [("9464", ("127.0.0.1", 9464)), ("127.0.0.1:9464", ("127.0.0.1", 9464)),
                                        ("[::1]:9464", ("::1", 9464)), ("0.0.0.0:80", ("0.0.0.0", 80))])
def test_listen_addresses(given, want):
    assert metricserver.parse_listen(given) == want


@pytest.mark.parametrize("bad", ["localhost:9464", "9464x", "127.0.0.1:0", "127.0.0.1:70000", "", "a;b:1"])
def test_a_listen_that_is_no_address_is_one_error_and_no_name_is_resolved(bad):
    with pytest.raises(ProxytuneError, match="--listen"):
        metricserver.parse_listen(bad)


def test_the_endpoint_serves_metrics_and_nothing_else():
    e = metricserver.Endpoint("127.0.0.1", 0)
    try:
        e.update('proxytune_watch_episodes_total 2\n')
        with urllib.request.urlopen(f"http://{e.address}/metrics", timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert resp.read() == b"proxytune_watch_episodes_total 2\n"
        for path, method, code in (("/", "GET", 404), ("/metrics", "POST", 405)):
            req = urllib.request.Request(f"http://{e.address}{path}", method=method, data=b"" if method == "POST" else None)
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=5)
            assert err.value.code == code
        with pytest.raises(ProxytuneError, match="cannot listen on 127.0.0.1"):
            metricserver.Endpoint("127.0.0.1", int(e.address.rsplit(":", 1)[1]))
    finally:
        e.close()


def test_clients_that_hold_the_endpoint_open_cost_a_bounded_number_of_threads_and_fds(monkeypatch):
    """Any local user can connect: 100 idle connections kept 100 threads and fds of root's watcher
    and ran it out of descriptors. Now at most MAX_CLIENTS are served, each for CLIENT_TIMEOUT_S, and
    a scrape still gets through once they time out."""
    import socket
    import threading
    monkeypatch.setattr(metricserver, "CLIENT_TIMEOUT_S", 1.0)
    e = metricserver.Endpoint("127.0.0.1", 0)
    host, port = e.address.rsplit(":", 1)
    threads0, fds0 = threading.active_count(), len(os.listdir("/proc/self/fd"))
    idle = []
    try:
        e.update("proxytune_watch_episodes_total 0\n")
        for _ in range(40):
            idle.append(socket.create_connection((host, int(port)), timeout=5))
        time.sleep(0.5)
        # ours: 40 client sockets; the server's: MAX_CLIENTS served, the rest closed as they come
        assert threading.active_count() - threads0 <= metricserver.MAX_CLIENTS
        assert len(os.listdir("/proc/self/fd")) - fds0 <= 40 + metricserver.MAX_CLIENTS + 2
        time.sleep(metricserver.CLIENT_TIMEOUT_S + 1.0)        # the idle ones time out
        with urllib.request.urlopen(f"http://{e.address}/metrics", timeout=5) as resp:
            assert resp.read() == b"proxytune_watch_episodes_total 0\n"
        # a trickle (4 bytes a second, each read well inside the timeout) is cut at the whole deadline
        slow = socket.create_connection((host, int(port)), timeout=5)
        slow.settimeout(None)                  # blocking mode: MSG_DONTWAIT below must not wait (timeout mode would)
        idle.append(slow)
        t0, cut_after = time.monotonic(), None
        for ch in b"GET /metrics HTTP/1.0\r\nX-Long: " + b"a" * 60:       # 22 s of trickle in all
            try:
                slow.sendall(bytes([ch]))
                if slow.recv(1, socket.MSG_DONTWAIT) == b"":            # the server shut it: end of file
                    cut_after = time.monotonic() - t0
                    break
            except BlockingIOError:
                pass
            except OSError:                                            # reset: cut too
                cut_after = time.monotonic() - t0
                break
            time.sleep(0.25)
        assert cut_after is not None and cut_after < metricserver.CLIENT_TIMEOUT_S + 2, cut_after
    finally:
        for c in idle:
            c.close()
        e.close()


@needs_root
def test_one_local_user_holding_connections_does_not_keep_a_scrape_out():
    """nobody keeps 20 connections open (reconnecting as they are cut): with 8 slots for all, a scrape
    from another user waited for them. Each local uid is served MAX_PER_PEER at once (the uid owning
    the client's socket, from sock_diag), so the scrape is answered at once."""
    import subprocess
    e = metricserver.Endpoint("127.0.0.1", 0)
    host, port = e.address.rsplit(":", 1)
    hog = subprocess.Popen([*NOBODY, "/usr/bin/python3", "-c", (
        "import socket, time\n"
        f"held = [socket.create_connection(({host!r}, {port}), timeout=5) for _ in range(20)]\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout.readline().strip() == "held"
        e.update("proxytune_watch_episodes_total 3\n")
        t0 = time.monotonic()
        with urllib.request.urlopen(f"http://{e.address}/metrics", timeout=5) as resp:
            assert resp.read() == b"proxytune_watch_episodes_total 3\n"
        assert time.monotonic() - t0 < metricserver.CLIENT_TIMEOUT_S / 2
    finally:
        hog.kill()
        hog.wait()
        e.close()


def test_clients_that_reset_print_nothing(capfd):
    """A reset after connect, mid-request or after a whole one printed a traceback each (socketserver's
    handle_error): 20 lines a reset, and a storm of them floods root's journal past its rate limit."""
    import socket
    import struct
    e = metricserver.Endpoint("127.0.0.1", 0)
    host, port = e.address.rsplit(":", 1)
    try:
        for payload in (b"", b"GET /metr", b"GET /metrics HTTP/1.0\r\n\r\n") * 7:
            c = socket.create_connection((host, int(port)), timeout=5)
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close = RST
            if payload:
                c.sendall(payload)
            c.close()
        time.sleep(0.5)
        with urllib.request.urlopen(f"http://{e.address}/metrics", timeout=5) as resp:
            assert resp.status == 200
    finally:
        e.close()
    assert capfd.readouterr().err == ""


def test_the_watcher_s_cpu_counts_its_own_and_its_reaped_children_s():
    before = watchmetrics.watcher_cpu_seconds()
    t = os.times()
    sum(i * i for i in range(2_000_000))
    after = watchmetrics.watcher_cpu_seconds()
    assert after - before >= 0.5 * ((os.times().user + os.times().system) - (t.user + t.system))
    assert after >= os.times().user + os.times().system

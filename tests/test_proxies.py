"""HAProxy, Varnish and Traffic Server as targets: their profiles, the doctor's
reading of each proxy (identity, config, own statistics) and bench proxy
driving each one from Debian's packages."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import IS_ROOT, REPO, proxytune

NEW_PROFILES = {"linux/haproxy": ("haproxy", "haproxy"), "linux/varnish": ("varnish", "vcache"),
                "linux/trafficserver": ("trafficserver", "trafficserver")}


@pytest.mark.parametrize("name", sorted(NEW_PROFILES))
def test_proxy_profile_checks_on_this_host(name, sandbox):
    p = proxytune("tune", "check", "-p", name, "--json")
    assert p.returncode in (0, 1), p.stderr
    doc = json.loads(p.stdout)
    data = doc.get("data", doc)
    service, user = NEW_PROFILES[name]
    assert (data["params"]["values"]["service"], data["params"]["values"]["user"]) == (service, user)
    assert {s["status"] for s in data["settings"]} <= {"met", "drift", "n/a"}, data["settings"]
    shown = json.loads(proxytune("profiles", "show", name, "--json").stdout)
    assert all(s["reason"].strip() and s["source"].strip() for s in shown["settings"])


def test_haproxy_profile_gives_two_fds_per_connection_of_its_maxconn():
    shown = json.loads(proxytune("profiles", "show", "linux/haproxy", "--json").stdout)
    fd = {s["setting"]: s["wanted"] for s in shown["settings"] if s["setting"].endswith(("nofile", "LimitNOFILE"))}
    assert "maxconn 60000" in shown["description"]
    assert len(fd) == 3 and all(v >= 2 * 60000 for v in fd.values()), fd


# ---------------------------------------------------------------- the doctor, one case per proxy

needs_doctor = pytest.mark.skipif(not (IS_ROOT and shutil.which("bpftrace") and shutil.which("wrk")),
                                  reason="needs root, bpftrace and wrk")
WINDOW = "4"


def doctor(pid: int) -> dict:
    r = proxytune("doctor", "--pid", str(pid), "--duration", WINDOW, "--no-perf", "--json", timeout=180)
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    print(json.dumps([(f["id"], f["fix"], f["evidence"]) for f in doc["findings"]], default=str)[:3000])
    return doc


def by_id(doc: dict) -> dict:
    return {f["id"]: f for f in doc["findings"]}


class HeldConnections:
    """N plain TCP connections to a port, opened without waiting for accept() and held open."""

    def __init__(self, port: int, n: int):
        self.port, self.n, self.socks = port, n, []

    def __enter__(self):
        import socket
        for _ in range(self.n):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", self.port))
            self.socks.append(s)
        return self

    def __exit__(self, *exc):
        for s in self.socks:
            s.close()


def wrk_background(port: int, seconds: int, connections: int, script: Path | None = None) -> subprocess.Popen:
    argv = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--timeout", "2s"] + \
        (["-s", str(script)] if script else []) + [f"http://127.0.0.1:{port}/"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(p: subprocess.Popen) -> None:
    p.terminate()
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


@needs_doctor
@pytest.mark.skipif(not Path("/usr/sbin/haproxy").exists(), reason="needs haproxy")
def test_haproxy_at_its_maxconn_is_the_finding_not_somaxconn():
    from microbench import proxyservers, servers
    with servers.Nginx() as origin, proxyservers.HAProxy(origin.port, maxconn=50, cache_mb=0) as h:
        with HeldConnections(h.port, 300):
            load = wrk_background(h.port, 25, 50)
            try:
                doc = doctor(h.pid)
            finally:
                stop(load)
        conf = str(h.conf)
    f = by_id(doc)
    assert "haproxy-maxconn" in f, doc["findings"]
    own = f["haproxy-maxconn"]
    assert doc["findings"][0]["id"] == "haproxy-maxconn"
    assert "`maxconn 50`" in own["fix"] and f"{conf}:2" in own["fix"]
    assert own["evidence"]["Maxconn"] == 50 and own["evidence"]["CurrConns"] >= 48
    assert own["evidence"]["stats"].startswith("show info on ")
    assert "accept-queue-overflow" not in f            # folded into the finding as its kernel symptom
    assert own["evidence"]["kernel_symptom"]["finding"] == "accept-queue-overflow"
    assert not any("somaxconn" in x["fix"] for x in doc["findings"] if x["id"] != "haproxy-maxconn")
    proxy = doc["data"]["evidence"]["proxy"]
    assert proxy["kind"] == "haproxy" and proxy["config"] == conf

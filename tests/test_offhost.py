"""Nothing leaves the host: every proxy `bench proxy` starts (Squid, nginx, HAProxy, Varnish, Traffic
Server, and the nginx origin) sends no packet on a non-loopback interface.

The host's own interfaces also carry the host's traffic (ssh, agents, their DNS lookups), so counting
there would flake. The bench runs instead in a sandbox that is a host of its own: a network namespace
(`unshare -n`) with loopback and one "uplink" veth, its default route and its resolver
(/etc/resolv.conf bind-mounted in a private mount namespace) out through that uplink. Only the
processes of this test live there, so every packet the uplink sends is ours: its tx counters and an
unfiltered capture on it must both stay at zero. The positive control proves they would not: a reverse
lookup of the uplink's own address (what Traffic Server did at every start) is seen by both.

Run as `python tests/test_offhost.py control|bench` inside the sandbox, it is the driver that prints
what it measured as one JSON line.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
UPLINK, PEER = "offhost0", "offhost1"
ADDRESS, RESOLVER = "198.51.100.7", "198.51.100.53"      # TEST-NET-2: no real host is there
PROXY_BINARIES = ("/usr/sbin/squid", "/usr/sbin/nginx", "/usr/sbin/haproxy", "/usr/sbin/varnishd",
                  "/usr/bin/traffic_server")

# the sandbox: loopback, and an uplink whose packets go nowhere (its veth peer has no address and the
# namespace does not forward); arp off, so that a packet is sent at once rather than held for an ARP
# answer that never comes; no IPv6 on it, so that the kernel sends no neighbour discovery of its own
SANDBOX = f"""
ip link set lo up
ip link add {UPLINK} type veth peer name {PEER}
for i in {UPLINK} {PEER}; do
    [ ! -e /proc/sys/net/ipv6/conf/$i ] || echo 1 > /proc/sys/net/ipv6/conf/$i/disable_ipv6
done
ip link set {UPLINK} arp off
ip addr add {ADDRESS}/24 dev {UPLINK}
ip link set {PEER} up
ip link set {UPLINK} up
ip route add default dev {UPLINK}
mount --bind "$OFFHOST_RESOLV" /etc/resolv.conf
mount -t sysfs sysfs /sys                  # /sys/class/net of this namespace, not of the host
exec "$OFFHOST_PYTHON" "$OFFHOST_DRIVER" "$OFFHOST_WHAT"
"""


def tx_packets() -> dict:
    """Packets sent so far by every interface but loopback, by its own kernel counter."""
    net = Path("/sys/class/net")
    return {i.name: int((i / "statistics" / "tx_packets").read_text()) for i in net.iterdir() if i.name != "lo"}


class Capture:
    """tcpdump on one interface, every packet; the lines it printed once left."""

    def __init__(self, iface: str):
        self.argv = ["tcpdump", "-i", iface, "-n", "-l", "-Z", "root"]
        self.lines: list[str] = []

    def __enter__(self):
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said = ""
        while "listening on" not in said:           # "listening on IFACE ...": the capture is open
            line = self.proc.stderr.readline()
            if not line:
                self.proc.kill()
                raise RuntimeError(f"tcpdump did not start: {said}")
            said += line
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=30)
        self.lines = [line for line in out.splitlines() if line.strip()]
        return False


def measured(what) -> dict:
    before = tx_packets()
    with Capture(UPLINK) as cap:
        detail = what()
    after = tx_packets()
    return {"sent": {i: after[i] - before[i] for i in after}, "captured": cap.lines, "detail": detail}


def control() -> dict:
    """A reverse lookup of the uplink's address through the C library, as traffic_server made one."""
    p = subprocess.run(["getent", "hosts", ADDRESS], capture_output=True, text=True, timeout=60)
    return {"getent_exit": p.returncode}


def bench() -> dict:
    """`bench proxy --quick` on every proxy and store, with a small plan."""
    sys.path.insert(0, str(REPO))
    import cli  # noqa: F401  (registers the proxytune package)
    from proxytune.microbench import proxybench
    proxybench.QUICK.update(fill_s=1, steady_s=2, files=200, cache_mb=64)
    r = proxybench.run(quick=True, concurrency=10, idle=5, quiet=True, proxies=["all"])
    return {"stores": [[s["proxy"], s["store"], s["steady"]["requests"]] for s in r["stores"]]}


def lookups() -> dict:
    """A name asked of the forward proxies, Squid and Traffic Server, which resolve it with their own
    DNS clients (the reverse proxies only ever reach their origin's IP literal): each answers an error."""
    import urllib.error
    import urllib.request
    sys.path.insert(0, str(REPO))
    import cli  # noqa: F401
    from proxytune.microbench import proxyservers, servers
    out = {}
    for name, make in (("squid", lambda: servers.Squid("ufs", cache_mb=64)),
                       ("trafficserver", lambda: proxyservers.TrafficServer(cache_mb=64))):
        with make() as s:
            via = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{s.port}"}))
            try:
                # the proxies give up on the name after seconds (their dns_timeout / dns.lookup_timeout)
                out[name] = via.open(f"http://offhost-{os.getpid()}.invalid/", timeout=120).status
            except urllib.error.HTTPError as e:
                out[name] = e.code
    return out


def in_sandbox(what: str, tmp_path: Path) -> dict:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver {RESOLVER}\noptions timeout:1 attempts:1\n")
    env = {**os.environ, "OFFHOST_RESOLV": str(resolv), "OFFHOST_PYTHON": str(REPO / ".venv/bin/python"),
           "OFFHOST_DRIVER": __file__, "OFFHOST_WHAT": what}
    p = subprocess.run(["unshare", "--net", "--mount", "--propagation", "slave", "bash", "-euo", "pipefail",
                        "-c", SANDBOX], capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


needs_sandbox = pytest.mark.skipif(
    not (os.geteuid() == 0 and all(shutil.which(t) for t in ("unshare", "ip", "tcpdump", "getent"))),
    reason="needs root, unshare, ip, tcpdump and getent")


@needs_sandbox
def test_the_sandbox_uplink_sees_a_lookup_sent_to_the_resolver(tmp_path):
    """Positive control: the counters and the capture both see what a proxy's reverse lookup sends."""
    r = in_sandbox("control", tmp_path)
    assert r["detail"]["getent_exit"] != 0                  # nobody answered: the query went out, unanswered
    assert r["sent"][UPLINK] >= 1, r
    assert any(f"> {RESOLVER}.53:" in line and "PTR?" in line and "7.100.51.198.in-addr.arpa" in line
               for line in r["captured"]), r["captured"]


@needs_sandbox
@pytest.mark.skipif(not (shutil.which("wrk") and all(Path(p).exists() for p in PROXY_BINARIES)),
                    reason="needs wrk, squid, nginx, haproxy, varnish and trafficserver")
def test_bench_proxy_sends_nothing_off_the_host(tmp_path):
    """Every proxy and store under load, and the origin: not one packet on the uplink."""
    r = in_sandbox("bench", tmp_path)
    stores = r["detail"]["stores"]
    assert [(p, s) for p, s, _ in stores] == [
        ("squid", "ufs"), ("squid", "aufs"), ("squid", "rock"), ("nginx", "proxy_cache"), ("haproxy", "cache"),
        ("varnish", "malloc"), ("varnish", "file"), ("trafficserver", "file"), ("trafficserver", "raw")]
    assert all(n > 0 for _, _, n in stores), stores        # each proxy served: it ran, not failed to start
    assert r["captured"] == [], r["captured"]
    assert set(r["sent"].values()) == {0}, r["sent"]


@needs_sandbox
@pytest.mark.skipif(not all(Path(p).exists() for p in PROXY_BINARIES[::4]), reason="needs squid and trafficserver")
def test_a_name_the_forward_proxies_resolve_stays_on_the_host(tmp_path):
    """Squid's and Traffic Server's own DNS clients ask loopback, not the resolver of /etc/resolv.conf."""
    r = in_sandbox("lookups", tmp_path)
    assert all(code >= 500 for code in r["detail"].values()), r["detail"]     # tried, and failed to resolve
    assert r["captured"] == [], r["captured"]
    assert set(r["sent"].values()) == {0}, r["sent"]


if __name__ == "__main__":
    print(json.dumps(measured({"control": control, "bench": bench, "lookups": lookups}[sys.argv[1]])))

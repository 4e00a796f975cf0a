"""The doctor's generic findings, each proven on at least two real proxies.

One cell = one proxy with one known fault and a load that meets it, in a
network namespace of its own (its sysctls and TcpExt counters are the
cell's alone), started once; the doctor then runs three windows in a row
and every run must name the fault. Whole JSON of every run goes to
$PROXYTUNE_EVIDENCE_DIR (else the test's tmp dir); with
$PROXYTUNE_MATRIX_RESULTS one JSON line per run and mode is appended there.

Mechanisms (why each fault shows):
- fd: at RLIMIT_NOFILE accept4() fails EMFILE (nginx, haproxy); squid defers
  accepts before that (its RESERVED_FD) and its own finding leads.
- accept queue: a listen backlog of 8 (sk_max_ack_backlog = min(backlog,
  net.core.somaxconn); squid has no backlog directive, so its namespace's
  somaxconn is 8) and bursts of hundreds of connects: tcp_conn_request()
  drops SYNs while the accept queue is full and counts ListenOverflows.
- SYN queue: TCP_DEFER_ACCEPT (nginx `deferred`, haproxy `defer-accept`)
  keeps a connection that sent no data in the request (SYN) queue;
  inet_csk_reqsk_queue_is_full() compares that queue with the same backlog
  of 8, and with tcp_syncookies=0 (per network namespace) the next SYN is
  dropped as TCPReqQFullDrop (tcp_max_syn_backlog is not what fills: with
  cookies off it only drops early, counted as ListenDrops alone).
- ephemeral ports: a 64-port ip_local_port_range and an origin that holds
  each request 1 s with no keep-alive: more requests in flight than ports,
  so the proxy's connect() fails EADDRNOTAVAIL (__inet_hash_connect).
- blocking disk: the cache on a filesystem mounted `sync`: every write
  and create of squid ufs (main loop) or nginx proxy_cache (the worker)
  waits for the device in D state.
- atime / churn: the cache on a loop ext4 mounted strictatime, cache misses
  on unique URLs: one file created per object.

- another listener's overflow: TcpExt ListenOverflows/ListenDrops and
  TCPReqQFull* count every listener of the network namespace. Next to a
  healthy proxy under paced load, a listener that never accepts (backlog 4,
  a hung service) or another proxy's (nginx, backlog 8, bursts as in the
  accept cells) overflows; each listener's own drop count (sk_drops, which
  tcp_listendrop() raises) says it was not the watched proxy's, and the
  doctor names the one that dropped in a low note.

Not here: Varnish and Traffic Server keep objects in one file or memory
(no churn, no atime per object) and do their disk I/O off the event loop;
squid has no TCP_DEFER_ACCEPT, so its SYN queue never holds a connection
that completed its handshake.
"""

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import IS_ROOT
import generic_cells as g

pytestmark = pytest.mark.skipif(
    not (IS_ROOT and shutil.which("bpftrace") and shutil.which("wrk") and shutil.which("mkfs.ext4")
         and all(Path(p).exists() for p in ("/usr/sbin/nginx", "/usr/sbin/squid", "/usr/sbin/haproxy"))),
    reason="needs root, bpftrace, wrk, mkfs.ext4, nginx, squid and haproxy")

WINDOW = "3"
RUNS = 3
LOAD_S = 600                  # far longer than three doctor runs on a loaded host; the cell stops its load on exit
PORT_RANGE = "40000 40063"
MISS_LUA = """local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "%s/m/" .. math.random(1000000000) .. "/" .. n)
end
"""


@dataclass
class Target:
    pid: int
    extra: list[str] = field(default_factory=list)     # more doctor options (--cache-dir)
    mount: str | None = None                           # the cache filesystem's mountpoint
    other: str | None = None                           # another process's listener that overflows (ip:port)


@dataclass
class Cell:
    proxy: str
    setup: object                          # a generator function (tmp) -> yields Target


def _miss_lua(tmp: Path, origin: str = "") -> Path:
    """Unique URLs: every request a miss. Squid is a forward proxy here and needs the origin's absolute
    URL; nginx's proxy_cache is a reverse proxy and takes the path."""
    lua = tmp / "miss.lua"
    lua.write_text(MISS_LUA % origin)
    return lua


@contextlib.contextmanager
def _load(*procs):
    try:
        yield
    finally:
        for p in procs:
            g.stop(p)


# ------------------------------------------------------------------ the faults, one generator each

def fd_nginx(tmp):
    from proxytune.microbench import servers
    with g.netns(), servers.Nginx(workers=1, rlimit_nofile=64) as ng, _load(g.wrk(ng.port, LOAD_S, 300)):
        yield Target(ng.pid)


def fd_squid(tmp):
    from proxytune.microbench import servers
    with g.netns(), servers.Nginx() as origin, servers.Squid("rock", cache_mb=64, nofile=(256, 256)) as sq, \
            g.Connector(sq.port, 400, every=LOAD_S), _load(g.wrk(sq.port, LOAD_S, 20)):
        yield Target(sq.pid)


def fd_haproxy(tmp):
    from proxytune.microbench import proxyservers, servers
    with g.netns(), servers.Nginx() as origin, \
            proxyservers.HAProxy(origin.port, maxconn=None, cache_mb=0, nofile=(256, 256)) as h, \
            g.Connector(h.port, 400, every=LOAD_S), _load(g.wrk(h.port, LOAD_S, 50)):
        yield Target(h.pid)


def accept_nginx(tmp):
    from proxytune.microbench import servers
    with g.netns(), servers.Nginx(listen="backlog=8") as ng, _load(g.wrk(ng.port, LOAD_S, 100)), \
            g.Connector(ng.port, 300, every=0.2, seconds=LOAD_S):
        yield Target(ng.pid)


def accept_haproxy(tmp):
    from proxytune.microbench import proxyservers, servers
    with g.netns(), servers.Nginx() as origin, proxyservers.HAProxy(origin.port, cache_mb=0, bind="backlog 8") as h, \
            _load(g.wrk(h.port, LOAD_S, 100)), g.Connector(h.port, 300, every=0.2, seconds=LOAD_S):
        yield Target(h.pid)


def accept_squid(tmp):
    """Squid has no backlog directive: listen() asks for a long queue and the kernel caps it at
    net.core.somaxconn (per network namespace, read at listen()), here 8."""
    from proxytune.microbench import servers
    with g.netns({"net.core.somaxconn": "8"}), servers.Nginx() as origin, servers.Squid("rock", cache_mb=64) as sq, \
            _load(g.wrk(sq.port, LOAD_S, 100)), g.Connector(sq.port, 300, every=0.2, seconds=LOAD_S):
        yield Target(sq.pid)


SYN_NS = {"net.ipv4.tcp_syncookies": "0"}


def syn_nginx(tmp):
    from proxytune.microbench import servers
    with g.netns(SYN_NS), servers.Nginx(listen="backlog=8 deferred") as ng, \
            g.Connector(ng.port, 60, every=0.25, seconds=LOAD_S):
        yield Target(ng.pid)


def syn_haproxy(tmp):
    from proxytune.microbench import proxyservers, servers
    with g.netns(SYN_NS), servers.Nginx() as origin, \
            proxyservers.HAProxy(origin.port, cache_mb=0, bind="backlog 8 defer-accept") as h, \
            g.Connector(h.port, 60, every=0.25, seconds=LOAD_S):
        yield Target(h.pid)


def _ports_run_short(port: int, base: str = ""):
    """Narrow the namespace's port range once the servers listen, then 150 requests in flight."""
    g.set_sysctl("net.ipv4.ip_local_port_range", PORT_RANGE)
    return g.BoundClients(port, 150, range(61000, 65000), seconds=LOAD_S, base=base)


def ports_nginx(tmp):
    from proxytune.microbench import proxyservers
    with g.netns(), g.SlowOrigin(1.0) as origin, proxyservers.NginxCache(origin.port, cache_mb=64) as ng, \
            _ports_run_short(ng.port):
        yield Target(ng.pid)


def ports_haproxy(tmp):
    from proxytune.microbench import proxyservers
    with g.netns(), g.SlowOrigin(1.0) as origin, proxyservers.HAProxy(origin.port, cache_mb=0) as h, \
            _ports_run_short(h.port):
        yield Target(h.pid)


def ports_squid(tmp):
    """Squid keeps server connections (server_persistent_connections on), but this origin closes each."""
    from proxytune.microbench import servers
    with g.netns(), g.SlowOrigin(1.0) as origin, servers.Squid("rock", cache_mb=64) as sq, \
            _ports_run_short(sq.port, f"http://127.0.0.1:{origin.port}"):
        yield Target(sq.pid)


PACED_LUA = "delay = function()\n  return 100\nend\n"


def _paced(tmp: Path) -> Path:
    """wrk's script for light load: a 100 ms pause per request and connection."""
    lua = tmp / "paced.lua"
    lua.write_text(PACED_LUA)
    return lua


def elsewhere_stuck_nginx(tmp):
    """A healthy nginx and, in its namespace, a hung service's listener that bursts of connects overflow."""
    from proxytune.microbench import servers
    with g.netns(), servers.Nginx() as ng, g.StuckListener(4) as stuck, \
            _load(g.wrk(ng.port, LOAD_S, 4, _paced(tmp))), g.Connector(stuck.port, 50, every=0.25, seconds=LOAD_S):
        yield Target(ng.pid, other=f"127.0.0.1:{stuck.port}")


def elsewhere_nginx_haproxy(tmp):
    """A healthy haproxy next to an nginx whose backlog of 8 bursts overflow (its queue empties between
    ticks: only its own drop count shows it)."""
    from proxytune.microbench import proxyservers, servers
    with g.netns(), servers.Nginx() as origin, proxyservers.HAProxy(origin.port, cache_mb=0) as h, \
            servers.Nginx(listen="backlog=8") as other, _load(g.wrk(h.port, LOAD_S, 4, _paced(tmp))), \
            g.Connector(other.port, 300, every=0.2, seconds=LOAD_S):
        yield Target(h.pid, other=f"127.0.0.1:{other.port}")


def _squid_store(tmp, options: str):
    from proxytune.microbench import servers
    with g.netns(), g.loop_fs(options) as mnt, servers.Nginx() as origin, \
            servers.Squid("ufs", cache_mb=200, cache_dir=mnt / "squid") as sq:
        with _load(g.wrk(sq.port, LOAD_S, 20, _miss_lua(tmp, f"http://127.0.0.1:{origin.port}"))):
            yield Target(sq.pid, mount=str(mnt))


def _nginx_store(tmp, options: str):
    from proxytune.microbench import proxyservers, servers
    with g.netns(), g.loop_fs(options) as mnt, servers.Nginx() as origin:
        cache = mnt / "nginx"
        cache.mkdir()
        shutil.chown(cache, "www-data", "www-data")
        with proxyservers.NginxCache(origin.port, cache_mb=200, cache_dir=cache) as ng, \
                _load(g.wrk(ng.port, LOAD_S, 20, _miss_lua(tmp))):
            # nginx's proxy_cache_path is not read by the doctor: the operator names it
            yield Target(ng.pid, extra=["--cache-dir", str(cache)], mount=str(mnt))


def store_squid(tmp):
    yield from _squid_store(tmp, "strictatime")


def store_nginx(tmp):
    yield from _nginx_store(tmp, "strictatime")


def disk_squid(tmp):
    yield from _squid_store(tmp, "sync")


def disk_nginx(tmp):
    yield from _nginx_store(tmp, "sync")


CELLS = {name: Cell(g.EXPECT[name][0], setup) for name, setup in {
    "fd-nginx": fd_nginx, "fd-squid": fd_squid, "fd-haproxy": fd_haproxy,
    "accept-nginx": accept_nginx, "accept-haproxy": accept_haproxy, "accept-squid": accept_squid,
    "syn-nginx": syn_nginx, "syn-haproxy": syn_haproxy,
    "ports-nginx": ports_nginx, "ports-haproxy": ports_haproxy, "ports-squid": ports_squid,
    "disk-squid": disk_squid, "disk-nginx": disk_nginx,
    "store-squid": store_squid, "store-nginx": store_nginx,
    "elsewhere-stuck-nginx": elsewhere_stuck_nginx, "elsewhere-nginx-haproxy": elsewhere_nginx_haproxy}.items()}


def check(name: str, cell: Cell, doc: dict, t: Target) -> list[str]:
    """What this run got wrong (empty: the fault was named as the cell expects)."""
    by = {f["id"]: f for f in doc["findings"]}
    wrong = g.verdict_errors(name, [(f["id"], f["fix"]) for f in doc["findings"]])
    ev = doc["data"]["evidence"]
    if "ephemeral-port-exhaustion" in by and by["ephemeral-port-exhaustion"]["evidence"]["port_range"] != PORT_RANGE:
        wrong.append(f"port range read as {by['ephemeral-port-exhaustion']['evidence']['port_range']}")
    if t.mount and "cache-dir-atime" in by and t.mount not in [d["mountpoint"] for d in by["cache-dir-atime"]["evidence"]["dirs"]]:
        wrong.append(f"cache-dir-atime does not name the mount {t.mount}: {by['cache-dir-atime']['evidence']}")
    if t.other and t.other not in json.dumps(by.get("other-listener-overflow", {}).get("title", "")):
        wrong.append(f"the note does not name the listener that overflowed, {t.other}: "
                     f"{by.get('other-listener-overflow', {}).get('title')}")
    if t.other and (ev.get("netstat") or {}).get("ListenOverflows", 0) <= 0:
        wrong.append("harness: the other listener did not overflow in the window")
    if ev["proxy"] is None or ev["proxy"]["kind"] != cell.proxy:
        wrong.append(f"the doctor did not recognise {cell.proxy}: {(ev['proxy'] or {}).get('kind')}")
    return wrong


@pytest.mark.parametrize("name", sorted(CELLS))
def test_generic_fault_named_on_every_run(name, tmp_path):
    cell = CELLS[name]
    out = g.evidence_dir(tmp_path)
    failures = []
    with contextlib.contextmanager(cell.setup)(tmp_path) as t:
        time.sleep(1)                                  # the load reaches the fault
        for run in range(1, RUNS + 1):
            doc = g.doctor(t.pid, WINDOW, out / f"{name}-{run}.json", *t.extra)
            for mode in g.EXPECT[name][1]:
                g.record(name, cell.proxy, mode, run, doc)
            print(name, run, [(f["id"], f["severity"]) for f in doc["findings"]],
                  {f["id"]: f["fix"][:160] for f in doc["findings"]})
            failures += [f"run {run}: {w}" for w in check(name, cell, doc, t)]
    assert not failures, failures

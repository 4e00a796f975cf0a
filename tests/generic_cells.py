"""Harness for the generic-failure matrix (tests/test_matrix_generic.py):
a private network namespace the test process enters for one cell (its
sysctls and TcpExt counters are the cell's own), a loop-mounted ext4 cache
filesystem, the loads (wrk, connections that complete or stay half-open)
and the doctor run that saves its whole JSON. Nothing here changes the
host: every namespace, mount and loop device is made here and removed in
`finally`.
"""

import contextlib
import ctypes
import itertools
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from conftest import proxytune
from test_doctor import stop  # noqa: F401  (the cells' loads stop as the doctor tests' do)
from test_proxies import SlowOrigin, wrk_background as wrk  # noqa: F401

CLONE_NEWNET = 0x40000000

# cell -> (proxy, {mode: (finding id, must it be ranked first)}, {finding id: text its fix must name});
# the live matrix (test_matrix_generic.py) and the replay of its recorded runs (test_generic_replay.py)
# hold every run to the same verdict
STORE = {"cache-dir-atime": ("cache-dir-atime", False), "file-per-object-churn": ("file-per-object-churn", False)}
EXPECT = {
    "fd-nginx": ("nginx", {"fd-limit": ("fd-exhaustion", True)}, {"fd-exhaustion": "worker_rlimit_nofile"}),
    "fd-squid": ("squid", {"fd-limit": ("squid-fd-limit", True)}, {"squid-fd-limit": "max_filedescriptors"}),
    # haproxy never meets EMFILE: without maxconn it sizes maxconn from its fd limit (and refuses to start
    # when a set maxconn needs more fds), so its fd limit shows as its own maxconn cap
    "fd-haproxy": ("haproxy", {"fd-limit": ("haproxy-maxconn", True)}, {"haproxy-maxconn": "maxconn"}),
    "accept-nginx": ("nginx", {"accept-backlog": ("accept-queue-overflow", True)}, {"accept-queue-overflow": "backlog="}),
    "accept-haproxy": ("haproxy", {"accept-backlog": ("accept-queue-overflow", True)},
                       {"accept-queue-overflow": "`backlog 8192`"}),
    "accept-squid": ("squid", {"accept-backlog": ("accept-queue-overflow", True)},
                     {"accept-queue-overflow": "Squid_MaxFD >> 2"}),
    "syn-nginx": ("nginx", {"syn-backlog": ("syn-backlog-overflow", False)}, {"syn-backlog-overflow": "backlog="}),
    "syn-haproxy": ("haproxy", {"syn-backlog": ("syn-backlog-overflow", False)},
                    {"syn-backlog-overflow": "`backlog 8192`"}),
    "ports-nginx": ("nginx", {"ephemeral-ports": ("ephemeral-port-exhaustion", True)},
                    {"ephemeral-port-exhaustion": "keepalive"}),
    "ports-haproxy": ("haproxy", {"ephemeral-ports": ("ephemeral-port-exhaustion", True)},
                      {"ephemeral-port-exhaustion": "http-reuse"}),
    "ports-squid": ("squid", {"ephemeral-ports": ("ephemeral-port-exhaustion", True)},
                    {"ephemeral-port-exhaustion": "server_persistent_connections"}),
    "disk-squid": ("squid", {"blocking-disk-io": ("blocking-disk-io", False)},
                   {"blocking-disk-io": "instead of `cache_dir ufs`"}),
    "disk-nginx": ("nginx", {"blocking-disk-io": ("blocking-disk-io", False)}, {"blocking-disk-io": "aio_write on"}),
    "store-squid": ("squid", STORE, {"file-per-object-churn": "cache_dir rock"}),
    "store-nginx": ("nginx", STORE, {"file-per-object-churn": "proxy_cache_min_uses"}),
    # issue 28: TcpExt counts every listener of the namespace; a healthy proxy next to a listener that
    # overflows gets a low note naming that listener, never the overflow as its own finding: a stuck
    # service's listener (its queue full at every tick) and another proxy's (drops seen only by its count)
    "elsewhere-stuck-nginx": ("nginx", {"other-listener": ("other-listener-overflow", False)},
                              {"other-listener-overflow": "nothing to change in this proxy"}),
    "elsewhere-nginx-haproxy": ("haproxy", {"other-listener": ("other-listener-overflow", False)},
                                {"other-listener-overflow": "nothing to change in this proxy"}),
}
# cell -> finding ids its runs must not have (the namespace-wide counters are not the watched proxy's)
ABSENT = {cell: ("accept-queue-overflow", "syn-backlog-overflow", "listen-drops")
          for cell in ("elsewhere-stuck-nginx", "elsewhere-nginx-haproxy")}


def verdict_errors(cell: str, found: list[tuple[str, str]]) -> list[str]:
    """How the findings (id, fix) in rank order miss the cell's verdict; empty when they hold it."""
    _, modes, fix_names = EXPECT[cell]
    ids, fixes = [i for i, _ in found], dict(found)
    wrong = []
    for mode, (fid, first) in modes.items():
        if fid not in ids:
            wrong.append(f"{mode}: {fid} not among {ids}")
        elif first and ids[0] != fid:
            wrong.append(f"{mode}: {fid} ranked {ids.index(fid) + 1} of {ids}")
    for fid, text in fix_names.items():
        if fid in fixes and text not in fixes[fid]:
            wrong.append(f"{fid}: fix does not name {text}: {fixes[fid]}")
    wrong += [f"{fid} raised: the namespace's counters are another listener's" for fid in ABSENT.get(cell, ())
              if fid in ids]
    return wrong
_libc = ctypes.CDLL(None, use_errno=True)
_names = itertools.count()


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns(CLONE_NEWNET)")


@contextlib.contextmanager
def netns(sysctls: dict[str, str] | None = None):
    """Enter a new named network namespace (loopback up, these net.* sysctls set in it) with this
    thread; every process and socket made inside is there. Back to the old one and deleted after."""
    name = f"pt-generic-{os.getpid()}-{next(_names)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        new = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            _setns(new)
        finally:
            os.close(new)
        try:
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
            for key, value in (sysctls or {}).items():
                set_sysctl(key, value)
            yield name
        finally:
            _setns(home)
    finally:
        os.close(home)
        subprocess.run(["ip", "netns", "del", name], check=False)


def set_sysctl(key: str, value: str) -> None:
    """A net.* sysctl of the namespace this thread is in (never called outside netns())."""
    assert key.startswith("net."), key
    Path("/proc/sys", *key.split(".")).write_text(value)


@contextlib.contextmanager
def loop_fs(options: str, mb: int = 256):
    """An ext4 image on a loop device mounted with these options, in a temp dir of its own that the
    proxies' users can reach (pytest's is root's only); unmounted and removed after."""
    top = Path(tempfile.mkdtemp(prefix="pt-generic-fs-"))
    img, mnt = top / "fs.img", top / "mnt"
    try:
        top.chmod(0o755)
        mnt.mkdir()
        subprocess.run(["truncate", "-s", f"{mb}M", str(img)], check=True)
        # an inode per KiB: a store cell creates one file per miss (2,000 a second or more), and ext4's
        # default of one per 4 KiB on a small image runs out in half a minute; squid then exits
        subprocess.run(["mkfs.ext4", "-q", "-F", "-i", "1024", str(img)], check=True)
        subprocess.run(["mount", "-o", f"loop,{options}", str(img), str(mnt)], check=True)
        try:
            mnt.chmod(0o755)
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
    finally:
        shutil.rmtree(top, ignore_errors=True)


class Connector:
    """A thread that keeps opening `burst` non-blocking connections to the port every `every` s and
    closes the previous burst, for at most `seconds`: a listener whose queue is shorter than a burst
    sees its SYN or accept queue overflow (whether the connections ever send a byte does not matter)."""

    def __init__(self, port: int, burst: int, every: float = 0.25, seconds: float = 60):
        self.port, self.burst, self.every, self.seconds = port, burst, every, seconds
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        end, held = time.monotonic() + self.seconds, []
        while not self.done.is_set() and time.monotonic() < end:
            fresh = []
            for _ in range(self.burst):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", self.port))
                fresh.append(s)
            for s in held:
                s.close()
            held = fresh
            self.done.wait(self.every)
        for s in held:
            s.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(timeout=10)


def evidence_dir(tmp: Path) -> Path:
    d = Path(os.environ.get("PROXYTUNE_EVIDENCE_DIR") or tmp)
    d.mkdir(parents=True, exist_ok=True)
    return d


def doctor(pid: int, window: str, save_to: Path, *extra: str) -> dict:
    """One doctor run on pid (CPU sampling off unless `extra` says --perf); its whole JSON saved to save_to."""
    perf = "--perf" in extra
    extra = tuple(x for x in extra if x != "--perf") + (() if perf else ("--no-perf",))
    r = proxytune("doctor", "--pid", str(pid), "--duration", window, "--json", *extra, timeout=180)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    save_to.write_text(r.stdout)
    return json.loads(r.stdout)


def record(cell: str, proxy: str, mode: str, run: int, doc: dict) -> None:
    """One JSON line per run and mode to $PROXYTUNE_MATRIX_RESULTS, when it names a file."""
    out = os.environ.get("PROXYTUNE_MATRIX_RESULTS")
    if not out:
        return
    ids = [f["id"] for f in doc["findings"]]
    line = {"cell": cell, "proxy": proxy, "mode": mode, "run": run, "ids": ids,
            "first_fix": doc["findings"][0]["fix"] if doc["findings"] else None}
    with open(out, "a") as fh:
        fh.write(json.dumps(line) + "\n")


class StuckListener:
    """Another process's listener that never accepts (a hung service): a python3 process listening on
    127.0.0.1 with a backlog of `backlog`, in the namespace of the thread that starts it."""

    def __init__(self, backlog: int = 4):
        import sys
        code = ("import socket, sys, time\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\n"
                f"s.listen({int(backlog)})\nprint(s.getsockname()[1], flush=True)\ntime.sleep(900)\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        stop(self.proc)


class BoundClients:
    """`n` keep-alive HTTP clients in threads, each bound to an explicit local port from `ports`
    (outside a narrowed ip_local_port_range, so that only the proxy's own connects run short of
    ports), each sending GET BASE/p/<unique> one after the other for at most `seconds` (BASE: the
    origin's http://IP:PORT for a forward proxy, empty for a reverse proxy)."""

    def __init__(self, port: int, n: int, ports: range, seconds: float = 60, base: str = ""):
        self.port, self.n, self.seconds, self.base = port, n, seconds, base
        self.ports, self.lock = iter(ports), threading.Lock()
        self.done, self.count = threading.Event(), itertools.count()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(n)]

    def _connect(self) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with self.lock:
            s.bind(("127.0.0.1", next(self.ports)))
        s.settimeout(5)
        s.connect(("127.0.0.1", self.port))
        return s

    def _exchange(self, s: socket.socket) -> bool:
        """One request and its whole response; False when the connection is done."""
        s.sendall(f"GET {self.base}/p/{next(self.count)} HTTP/1.1\r\nHost: o\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        length = next((int(l.split(b":", 1)[1]) for l in head.split(b"\r\n")
                       if l.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                return False
            body += chunk
        return b"connection: close" not in head.lower()

    def _run(self) -> None:
        end, s = time.monotonic() + self.seconds, None
        while not self.done.is_set() and time.monotonic() < end:
            try:
                s = s or self._connect()
                if not self._exchange(s):
                    s.close()
                    s = None
            except (OSError, StopIteration, ValueError):
                if s:
                    s.close()
                s = None
                self.done.wait(0.05)
        if s:
            s.close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        for t in self.threads:
            t.join(timeout=10)

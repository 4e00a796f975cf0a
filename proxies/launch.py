"""What every bench launcher shares: a real server from Debian's package,
in the foreground, in its own session and temp dir, on a free loopback
port; a context manager whose exit stops it and removes the temp dir, also
on Ctrl-C. Nothing a server does leaves the host: each one's own DNS client
is pinned to a loopback port nothing answers on (tests/test_offhost.py).
Each proxy module's server class writes that proxy's config; wrk is the
load put on them."""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from proxytune.core.errors import ProxytuneError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_resolver() -> str:
    """127.0.0.1:PORT of a UDP port nothing listens on, for the DNS client of every server we start:
    a query it might send is refused on loopback at once, and never reaches the host's resolver."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise ProxytuneError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


def need(binary: str, package: str) -> str:
    path = shutil.which(binary) or (f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else None)
    if not path:
        raise ProxytuneError(f"{binary} is not installed", f"Debian: apt-get install {package}")
    return path


def limited(argv: list[str], nofile: tuple | None) -> list[str]:
    """argv started with this (soft, hard) fd limit, as a service's LimitNOFILE would start it."""
    return (["prlimit", f"--nofile={nofile[0]}:{nofile[1]}", "--"] if nofile else []) + argv


def tempdir(kind: str, owner: str | None = None) -> Path:
    d = Path(tempfile.mkdtemp(prefix=f"proxytune-{kind}-"))
    d.chmod(0o755)                                  # the proxies drop privileges and must reach their files
    if owner and os.geteuid() == 0:
        shutil.chown(d, owner, owner)
    return d


class Server:
    """A foreground server process in its own session, with a temp dir; stopped and removed on exit."""
    proc: subprocess.Popen | None = None
    dir: Path
    port: int
    grace: float = 10

    def _launch(self, argv: list[str], timeout: float = 20, stderr: Path | None = None) -> None:
        # stderr is not read while the server runs: a chatty server must not block on a full pipe (a file when
        # asked, for what the server says at start)
        with open(stderr, "wb") if stderr else open(os.devnull, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            wait_port(self.port, timeout)
        except BaseException:
            self.__exit__()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    stop_signal = signal.SIGTERM

    def __exit__(self, *exc):
        stop(self.proc, self.grace, self.stop_signal)
        shutil.rmtree(self.dir, ignore_errors=True)
        return False


def stop(proc: subprocess.Popen | None, grace: float, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
    except ProcessLookupError:
        pass


def wrk(url: str, seconds: float, connections: int = 50, threads: int = 2, script: str | None = None) -> dict:
    """Run wrk and return requests, req/s, socket errors and non-2xx counts from its summary
    (wrk takes whole seconds: a fraction would be refused, so it is rounded, to at least 1)."""
    exe = need("wrk", "wrk")
    argv = [exe, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s"]
    argv += (["-s", script] if script else []) + [url]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    return parse_wrk(p.stdout)


def parse_wrk(out: str) -> dict:
    r = {"requests": 0, "rps": 0.0, "errors": {}, "non_2xx": 0}
    if m := re.search(r"(\d+) requests in ([\d.]+)(m?s)", out):
        r["requests"] = int(m.group(1))
    if m := re.search(r"Requests/sec:\s+([\d.]+)", out):
        r["rps"] = float(m.group(1))
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        r["errors"] = dict(zip(("connect", "read", "write", "timeout"), map(int, m.groups())))
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        r["non_2xx"] = int(m.group(1))
    r["raw"] = out
    return r

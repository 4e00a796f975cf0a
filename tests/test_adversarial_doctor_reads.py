"""What the doctor reads and contacts on a watched proxy's behalf, attacked by
the proxy's owner (issue 20, classes 3 and 4 and their medium/low kin).

The "proxy" is tests/servers/fakeproxy.py run by a copy of the python binary
named haproxy, squid or nginx, as nobody (setpriv): the doctor recognises it
by that name and reads what its command line and config name. Root (this
test) owns what the attacker must not reach: a 0600 file, a unix socket
server counting the connections it gets.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import IS_ROOT, REPO, needs_root

pytestmark = pytest.mark.skipif(not IS_ROOT or not shutil.which("setpriv"), reason="needs root and setpriv")
FAKE = REPO / "tests" / "servers" / "fakeproxy.py"
NOBODY = 65534
SECRET = "maxconn 123  # root's secret line\nworker_connections are not enough\n"
LOOP = {"waits_per_s": 0, "events_per_s": 0, "events_per_wait": None, "accepts_per_s": 0, "cpu_cores": 0,
        "cpu_us_per_event": None}


# ------------------------------------------------------------------ helpers

@pytest.fixture(scope="module")
def bindir():
    """A world-readable dir with the python binary copied under each proxy's name."""
    d = Path(tempfile.mkdtemp(prefix="ptdoc-bin-"))
    d.chmod(0o755)
    for name in ("haproxy", "squid", "nginx"):
        shutil.copy(os.path.realpath(sys.executable), d / name)
    shutil.copy(FAKE, d / "fakeproxy.py")
    (d / "fakeproxy.py").chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def home():
    """A dir the attacker (nobody) owns, and root's dir beside it holding a 0600 secret."""
    top = Path(tempfile.mkdtemp(prefix="ptdoc-"))
    top.chmod(0o755)
    mine, roots = top / "nobody", top / "root"
    mine.mkdir()
    os.chown(mine, NOBODY, NOBODY)
    roots.mkdir(mode=0o755)
    (roots / "secret.cfg").write_text(SECRET)
    (roots / "secret.cfg").chmod(0o600)
    yield mine
    shutil.rmtree(top, ignore_errors=True)


class Fake:
    """fakeproxy.py as nobody, exec'd as `kind`, in `cwd`; stopped by the test."""

    def __init__(self, bindir: Path, kind: str, mode: list[str], proxy_args: list[str], cwd: Path):
        argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                str(bindir / kind), str(bindir / "fakeproxy.py"), *mode, *proxy_args]
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                                  env={"PATH": "/usr/bin:/bin"})
        line = self.p.stdout.readline().split()
        assert line[:1] == ["ready"], self.p.stderr.read() if self.p.poll() is not None else line
        self.pid = int(line[1])
        self.port = int(line[2]) if len(line) > 2 else None

    def stop(self):
        self.p.kill()
        self.p.wait()


@pytest.fixture
def fakes():
    started = []
    yield lambda *a: started.append(Fake(*a)) or started[-1]
    for f in started:
        f.stop()


def identify(pid: int):
    from proxytune.probes import proxies
    return proxies.identify(pid)


def timed(fn):
    t0 = time.monotonic()
    out = fn()
    return out, time.monotonic() - t0


class RootSocket:
    """A unix socket server root owns (mode 0666, like a service's socket), counting its connections."""

    def __init__(self, path: Path):
        self.path, self.accepted = path, 0
        self.srv = socket.socket(socket.AF_UNIX)
        self.srv.bind(str(path))
        path.chmod(0o666)
        self.srv.listen(8)
        self.srv.settimeout(0.2)
        self.stopped = False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stopped:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self):
        self.stopped = True
        self.t.join()
        self.srv.close()


# ------------------------------------------------------------------ class 3: files read on the target's behalf

def test_a_fifo_config_never_blocks_absolute_or_relative(bindir, home, fakes):
    """Squid -f naming a FIFO: by absolute path, and by a relative one in the target's cwd."""
    from proxytune.probes import doctor
    os.mkfifo(home / "squid.conf")
    for conf in (str(home / "squid.conf"), "squid.conf"):
        f = fakes(bindir, "squid", ["idle"], ["-f", conf, "-N"], home)
        target, took = timed(lambda: identify(f.pid))
        assert took < 10, took
        d = target.describe()
        assert d["config_read"] is False and "not a regular file" in d["config_unread"], d
        assert doctor.proxy_cache_dirs(target) == []            # from what was read as squid, never re-read by root


def test_dev_zero_and_a_huge_file_are_capped(bindir, home, fakes):
    """-f /dev/zero is refused (not a regular file); a 64 MiB sparse file is read to the cap only."""
    from proxytune.core import targetread
    f = fakes(bindir, "haproxy", ["idle"], ["-f", "/dev/zero"], home)
    d = identify(f.pid).describe()
    assert d["config_read"] is False and "not a regular file" in d["config_unread"]
    big = home / "big.cfg"
    with open(big, "wb") as fh:
        fh.write(b"global\n    maxconn 7\n")
        fh.truncate(64 << 20)
    os.chown(big, NOBODY, NOBODY)
    f = fakes(bindir, "haproxy", ["idle"], ["-f", str(big)], home)
    target = identify(f.pid)
    assert len(target.config_text) == targetread.MAX_BYTES
    assert target.conf["maxconn"] == {"value": "7", "line": 2, "file": str(big)}


def test_a_relative_config_is_the_targets_not_roots(bindir, home, fakes, tmp_path, monkeypatch):
    """A relative -f is resolved in the target's cwd even when root's cwd holds a file of that name."""
    (home / "h.cfg").write_text("global\n    maxconn 7\n")
    (tmp_path / "h.cfg").write_text("global\n    maxconn 9\n")
    monkeypatch.chdir(tmp_path)
    f = fakes(bindir, "haproxy", ["idle"], ["-f", "h.cfg"], home)
    assert identify(f.pid).conf["maxconn"]["value"] == "7"
    (home / "sub").mkdir()
    os.chown(home / "sub", NOBODY, NOBODY)
    f = fakes(bindir, "haproxy", ["idle"], ["-f", "../h.cfg"], home / "sub")
    assert identify(f.pid).conf["maxconn"]["value"] == "7"
    from proxytune.probes import doctor
    (home / "squid.conf").write_text("cache_dir ufs /var/spool/target 100 16 256\n")
    (tmp_path / "squid.conf").write_text("cache_dir ufs /var/spool/roots 100 16 256\n")
    f = fakes(bindir, "squid", ["idle"], ["-f", "squid.conf"], home)
    assert doctor.proxy_cache_dirs(identify(f.pid)) == ["/var/spool/target"]


def test_a_symlink_to_a_root_only_file_is_read_as_the_target_and_refused(bindir, home, fakes, capsys):
    """The config, and nginx's error log, are links to root's 0600 file: nothing of it is shown."""
    secret = home.parent / "root" / "secret.cfg"
    (home / "h.cfg").symlink_to(secret)
    f = fakes(bindir, "haproxy", ["idle"], ["-f", str(home / "h.cfg")], home)
    d = identify(f.pid).describe()
    assert d["config_read"] is False and d["directives"] == {}, d
    assert f"as uid {NOBODY}" in d["config_unread"] and "Permission denied" in d["config_unread"]
    assert "123" not in json.dumps(d)
    from proxytune.probes import render
    capsys.readouterr()
    render.doctor_report({"target": {"pids": [f.pid], "comm": "haproxy", "exited": {}}, "window_s": 1, "findings": [],
                          "evidence": {"skipped_scripts": {}, "proxy": {**d, "stats_after": {}}, "scripts": [],
                                       "perf": {}, "loop": LOOP, "audit": {"available": False}}})
    said = [l for l in capsys.readouterr().out.splitlines() if l.removeprefix("# ").startswith("proxy: haproxy")]
    assert len(said) == 1 and f"(not read: cannot read it as uid {NOBODY}: Permission denied)" in said[0], said
    (home / "n.conf").write_text(f"error_log {home / 'err.log'};\nevents {{ worker_connections 64; }}\n")
    (home / "err.log").symlink_to(secret)
    f = fakes(bindir, "nginx", ["idle"], ["-c", str(home / "n.conf")], home)
    target = identify(f.pid)
    assert target.stats()["not_enough_messages"] == 0          # root's line is there, but not the target's to read


def test_proc_self_of_the_reader_leads_to_nothing_of_roots(bindir, home, fakes, monkeypatch):
    """Second round: -f /proc/self/... names the reader itself, forked from root's doctor: its
    environment, its cwd (root's, in a 0700 dir), a directory fd root holds open."""
    monkeypatch.setenv("PT_ROOT_SECRET", "s3cr3t-env")
    private = home.parent / "root" / "private"
    private.mkdir(mode=0o700)
    (private / "notes.cfg").write_text("global\n    maxconn 4242\n")
    (private / "notes.cfg").chmod(0o644)                 # readable, but only through root's 0700 dir
    monkeypatch.chdir(private)
    held = os.open(private, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for conf in ("/proc/self/environ", "/proc/self/cwd/notes.cfg", f"/proc/self/fd/{held}/notes.cfg",
                     "/proc/self/mem"):
            f = fakes(bindir, "haproxy", ["idle"], ["-f", conf], home)
            d = identify(f.pid).describe()
            assert d["config_read"] is False, (conf, d)
            assert "s3cr3t" not in json.dumps(d) and "4242" not in json.dumps(d)
    finally:
        os.close(held)


def test_a_log_is_read_from_the_window_start_even_past_megabytes(bindir, home, fakes):
    """nginx's error log of 6 MiB: only what is appended in the window counts; a rotated log from 0."""
    log = home / "err.log"
    log.write_text("2026/01/01 worker_connections are not enough\n" * 140_000)   # ~6 MiB of old lines
    os.chown(log, NOBODY, NOBODY)
    (home / "n.conf").write_text(f"error_log {log};\nevents {{ worker_connections 64; }}\n")
    f = fakes(bindir, "nginx", ["idle"], ["-c", str(home / "n.conf")], home)
    target = identify(f.pid)
    assert target.stats()["not_enough_messages"] == 0           # window start: nothing new yet
    with open(log, "a") as fh:
        fh.write("2026/01/02 [alert] 12#12: 64 worker_connections are not enough\n" * 3)
    assert target.stats()["not_enough_messages"] == 3
    log.write_text("x worker_connections are not enough\n")    # rotated: shorter than the window-start offset
    assert target.stats()["not_enough_messages"] == 1


def test_varnishstat_runs_as_the_target_on_the_workdir_it_names(bindir, home, fakes, monkeypatch):
    """varnishd -n DIR: the helper that opens DIR runs with the target's uid and groups, not root's;
    a hostile answer (a JSON list, non-numbers) is no crash."""
    from proxytune.probes import proxies
    shutil.copy(os.path.realpath(sys.executable), bindir / "varnishd")
    seen = home.parent / "root" / "seen"
    helper = home.parent / "root" / "varnishstat"
    for answer, want in (('{"counters": {"MAIN.threads": {"value": 7}, "MAIN.sess_queued": {"value": "³"}}}',
                          {"available": True, "source": "varnishstat -j", "MAIN.threads": 7}),
                         ("[1, 2]", {"available": False})):
        helper.write_text(f"#!/bin/sh\nid -u >> {seen}\nid -G >> {seen}\necho '{answer}'\n")
        helper.chmod(0o755)
        (home.parent / "root").chmod(0o777)
        monkeypatch.setattr(proxies.RunningVarnish, "VARNISHSTAT", str(helper))
        f = fakes(bindir, "varnishd", ["idle"], ["-n", str(home.parent / "root"), "-F"], home)
        st = identify(f.pid).stats()
        assert {k: v for k, v in st.items() if k != "reason"} == want, st
    assert seen.read_text().split() == [str(NOBODY), str(NOBODY)] * 2


# ------------------------------------------------------------------ class 4: sockets and status pages

def test_a_slow_stats_socket_is_cut_at_a_total_deadline(bindir, home, fakes):
    """A stats socket the target holds that answers one byte a second: stats() ends within its deadline."""
    from proxytune.probes import proxies
    sock = home / "admin.sock"
    (home / "h.cfg").write_text(f"global\n    maxconn 10\n    stats socket {sock} mode 600\n")
    f = fakes(bindir, "haproxy", ["unix", str(sock)], ["-f", str(home / "h.cfg")], home)
    st, took = timed(lambda: identify(f.pid).stats())
    assert took < proxies.STATS_SECONDS + 20, took       # the reply would trickle for an hour: wide margin
    assert st["available"] is False and "deadline" in st["reason"], st


def test_a_slow_status_page_is_cut_at_a_total_deadline(bindir, home, fakes):
    """Squid's cache manager and nginx's stub_status on a port the target holds, one byte a second."""
    from proxytune.probes import proxies
    for kind, conf, flag in (("squid", "http_port 127.0.0.1:{port}\n", "-f"),
                             ("nginx", "events {{ }}\nhttp {{ server {{ listen 127.0.0.1:{port}; "
                                       "location /st {{ stub_status; }} }} }}\nerror_log /dev/null;\n", "-c")):
        f = fakes(bindir, kind, ["tcp"], [flag, str(home / f"{kind}.conf")], home)
        (home / f"{kind}.conf").write_text(conf.format(port=f.port))
        st, took = timed(lambda: identify(f.pid).stats())
        assert took < proxies.STATS_SECONDS + 20, (kind, took)   # the reply would trickle for an hour
        assert st["available"] is False and "deadline" in st["reason"], (kind, st)


def test_a_stats_socket_the_target_does_not_hold_is_never_contacted(bindir, home, fakes):
    """The config names root's socket; or the target's own socket path swapped for a link to root's."""
    server = RootSocket(home.parent / "root" / "service.sock")
    try:
        (home / "h.cfg").write_text(f"global\n    stats socket {server.path}\n")
        f = fakes(bindir, "haproxy", ["idle"], ["-f", str(home / "h.cfg")], home)
        st = identify(f.pid).stats()
        assert st["available"] is False and "not held by" in st["reason"], st
        mine = home / "admin.sock"
        os.symlink(server.path, str(mine) + ".link")
        (home / "h.cfg").write_text(f"global\n    stats socket {mine}\n")
        f = fakes(bindir, "haproxy", ["swap", str(mine)], ["-f", str(home / "h.cfg")], home)
        assert (home / "admin.sock").is_symlink()
        st = identify(f.pid).stats()
        assert st["available"] is False, st
        assert server.accepted == 0
    finally:
        server.close()


def test_a_stats_socket_reached_through_a_swapped_directory_is_never_contacted(bindir, home, fakes):
    """Second round: the target listens on DIR/admin.sock, then moves DIR away and links DIR to
    root's directory holding a socket of that name (the name in /proc/net/unix still matches)."""
    server = RootSocket(home.parent / "root" / "admin.sock")
    try:
        d = home / "run"
        d.mkdir()
        os.chown(d, NOBODY, NOBODY)
        (home / "h.cfg").write_text(f"global\n    stats socket {d}/admin.sock\n")
        f = fakes(bindir, "haproxy", ["swapdir", str(d), str(server.path.parent)], ["-f", str(home / "h.cfg")], home)
        assert d.is_symlink()
        st = identify(f.pid).stats()
        assert st["available"] is False and "not held by" in st["reason"], st
        assert server.accepted == 0
    finally:
        server.close()


def test_a_status_port_the_target_does_not_hold_is_never_contacted(bindir, home, fakes):
    """http_port names a port root's process listens on; or the target listens on that port of
    127.0.0.2, where the cache manager is not asked (it is asked on 127.0.0.1: root's)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    port = srv.getsockname()[1]
    try:
        for held, conf in ((["tcp"], f"http_port 127.0.0.1:{port}\n"),
                           (["tcp", f"127.0.0.2:{port}"], f"http_port 127.0.0.2:{port}\n")):
            (home / "squid.conf").write_text(conf)
            f = fakes(bindir, "squid", held, ["-f", str(home / "squid.conf")], home)
            st = identify(f.pid).stats()
            assert st["available"] is False and "not held by" in st["reason"], st
            with pytest.raises(BlockingIOError):
                srv.accept()
    finally:
        srv.close()


@pytest.mark.skipif(not shutil.which("bpftrace"), reason="needs bpftrace")
def test_the_whole_doctor_run_ends_with_a_slow_stats_socket_and_leaves_no_tracer(bindir, home, fakes):
    sock = home / "admin.sock"
    (home / "h.cfg").write_text(f"global\n    maxconn 10\n    stats socket {sock} mode 600\n")
    f = fakes(bindir, "haproxy", ["unix", str(sock)], ["-f", str(home / "h.cfg")], home)
    tmp = Path(tempfile.mkdtemp(prefix="ptdoc-run-"))
    try:
        t0 = time.monotonic()
        p = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "doctor", "--pid", str(f.pid),
                            "-d", "1", "--no-perf", "--json"], capture_output=True, text=True, timeout=150,
                           env={**os.environ, "TMPDIR": str(tmp)})
        assert p.returncode in (0, 1), p.stderr[-2000:]
        assert time.monotonic() - t0 < 100               # the socket would answer for an hour
        px = json.loads(p.stdout)["data"]["evidence"]["proxy"]
        assert "deadline" in px["stats_before"]["reason"] and "deadline" in px["stats_after"]["reason"]
        left = subprocess.run(["pgrep", "-f", str(tmp)], capture_output=True, text=True).stdout.split()
        assert not left and list(tmp.iterdir()) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------ medium: listeners by socket inode

def named(comm: bytes, port_holder: bool) -> subprocess.Popen:
    """A process that renames itself `comm`, holds a listener with a full accept queue (or nothing)."""
    code = ("import ctypes, socket, sys, time\n"
            f"ctypes.CDLL(None).prctl(15, {comm!r}, 0, 0, 0)\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
            "cs = [socket.socket() for _ in range(3)]\n"
            "[c.setblocking(False) or c.connect_ex(s.getsockname()) for c in cs]\n"
            f"print(s.getsockname()[1] if {port_holder} else 0, flush=True)\n"
            "time.sleep(60)\n")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("spoof", ["pid={victim}", '"),("x",pid={victim},fd=3))'])
def test_a_process_named_like_ss_output_cannot_lend_its_queue_to_another(spoof):
    from proxytune.core import sockets
    victim = subprocess.Popen(["sleep", "60"])
    liar = None
    try:
        liar = named(spoof.format(victim=victim.pid).encode()[:15], True)
        port = liar.stdout.readline().strip()
        assert port and port != "0"
        assert sockets.listeners([victim.pid]) == []
        assert sockets.connections({port}, [victim.pid]) == {"clients": 0, "total": 0}
        mine = sockets.listeners([liar.pid])
        assert [l["local"] for l in mine] == [f"127.0.0.1:{port}"] and mine[0]["pids"] == [liar.pid]
    finally:
        for p in (victim, liar):
            if p:
                p.kill()
                p.wait()


# ------------------------------------------------------------------ low: hostile values

def test_unicode_digits_in_config_and_stats_are_not_numbers(bindir, home, fakes):
    """`maxconn ³` (str.isdigit() says yes, int() says no) and varnishd -p thread_pools=³."""
    from proxytune.probes import proxies, proxies_findings
    (home / "h.cfg").write_text("global\n    maxconn ³\n")
    f = fakes(bindir, "haproxy", ["idle"], ["-f", str(home / "h.cfg")], home)
    t = identify(f.pid)
    ev = {"proxy": {**t.describe(), "stats_before": {}, "stats_after": {}},
          "procs": {"1": {"fds_open": 10}}}
    assert proxies_findings.caps(ev) == []          # no number: no cap, and the rule stays silent
    assert proxies.as_number("³") is None and proxies.as_number("٣") is None and proxies.as_number("42") == 42
    v = proxies.RunningVarnish.__new__(proxies.RunningVarnish)
    v.argv = ["varnishd", "-p", "thread_pools=³", "-p", "thread_pool_max=٣٣"]
    assert v.parse()["thread_pools"]["value"] == "2" and v.parse()["thread_pool_max"]["value"] == "5000"


def test_a_non_utf8_status_page_and_a_markup_comm_do_not_crash(capsys):
    from proxytune.core import sockets
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def answer():
        c, _ = srv.accept()
        c.recv(4096)
        c.sendall(b"HTTP/1.0 200 OK\r\n\r\n\xff\xfe[/]Active connections: 3 \r\n")
        c.close()
    threading.Thread(target=answer, daemon=True).start()
    try:
        status, body = sockets.http_get("127.0.0.1", srv.getsockname()[1], "/st", sockets.Deadline(5))
        assert status == 200 and "Active connections: 3" in body
    finally:
        srv.close()
    from proxytune.probes import render
    capsys.readouterr()
    render.doctor_report({"target": {"pids": [1], "comm": "[/]", "exited": {}}, "window_s": 1, "findings": [],
                          "evidence": {"skipped_scripts": {}, "proxy": None, "scripts": [], "perf": {"reason": "[/]"},
                                       "loop": LOOP, "audit": {"available": False, "reason": "[/x]"}}})
    out = capsys.readouterr().out
    assert out.count("[/]") == 2 and "[/x]" in out, out


@pytest.mark.skipif(not shutil.which("bpftrace"), reason="needs bpftrace")
def test_a_process_named_like_markup_is_shown_as_named_by_the_doctor():
    """`doctor --pid` on a process named `[/]` (rich's closing tag): its progress bar and report."""
    target = subprocess.Popen([sys.executable, "-c", "import ctypes, time\n"
                               "ctypes.CDLL(None).prctl(15, b'[/]', 0, 0, 0)\nprint(1, flush=True)\ntime.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    tmp = Path(tempfile.mkdtemp(prefix="ptdoc-run-"))
    try:
        assert target.stdout.readline().strip() == "1"
        p = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "doctor", "--pid", str(target.pid),
                            "-d", "0.5", "--no-perf"], capture_output=True, text=True, timeout=150,
                           env={**os.environ, "TMPDIR": str(tmp)})
        assert p.returncode in (0, 1) and "Traceback" not in p.stderr and "error" not in p.stderr, p.stderr[-2000:]
        assert any(l.removeprefix("# ").startswith("doctor: [/] (pids ") for l in p.stdout.splitlines()), \
            p.stdout[:300]                                       # piped: report lines are '#' comments
        assert "not a service name: '[/]'" in p.stdout           # the host audit's reason, shown as written
    finally:
        target.kill()
        target.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_stats_socket_is_never_asked_once_its_proxy_is_gone_even_if_the_pid_comes_back(tmp_path):
    """Ownership is read through the proxy's own /proc/PID directory, opened when it was identified: once
    that process exits the directory stays dead, so a process that later gets its pid (and listens on the
    same path) is never taken for it."""
    from proxytune.core import sockets, targetread
    path = tmp_path / "stats.sock"
    code = ("import socket,sys,time; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1); "
            "print('ready', flush=True); time.sleep(30)")
    p = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        proc = targetread.open_proc(p.pid)
        assert sockets.fd_inventory(p.pid, proc) is not None
        assert sockets.held([p.pid], proc)
    finally:
        p.kill()
        p.wait()
    assert sockets.fd_inventory(p.pid, proc) is None and sockets.held([p.pid], proc) == set()
    os.close(proc)


# ------------------------------------------- doctor reads: a pid recycled between discovery and read

RECYCLE = r"""
import os, subprocess, sys, tempfile
sys.path.insert(0, sys.argv[1])
import conftest  # noqa: F401  (registers the checkout as the `proxytune` package)
from proxytune.core import targetread
from proxytune.probes.proxies import Running
mine, roots = tempfile.mkdtemp(dir=sys.argv[2]), tempfile.mkdtemp(dir=sys.argv[2])
os.chmod(mine, 0o755)
open(os.path.join(mine, "cache.log"), "w").write("x" * 4096)         # big: a later, smaller file reads from 0
os.chmod(os.path.join(mine, "cache.log"), 0o644)
open(os.path.join(roots, "cache.log"), "w").write("ROOT-SECRET\n")   # root's, 0600, in root's cwd
os.chmod(os.path.join(roots, "cache.log"), 0o600)
proxy = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sleep", "60"], cwd=mine)
target = Running(proxy.pid, "/usr/sbin/squid", ["squid"])
target.appended("cache.log")                   # the window starts: the log's size noted
proxy.kill(); proxy.wait()
with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
    fh.write(str(proxy.pid - 1))
other = subprocess.Popen(["sleep", "60"], cwd=roots)                 # root, with the same pid
assert other.pid == proxy.pid, (other.pid, proxy.pid)
print("READ:" + repr(target.appended("cache.log")))
held = {"proc": target.proc} if hasattr(target, "proc") else {}     # the /proc/PID fd taken at discovery
print("WHY:" + str(targetread.read(proxy.pid, "cache.log", **held).why))
other.kill()
"""


@needs_root
def test_a_pid_recycled_by_a_root_process_is_never_read_as(tmp_path):
    """The proxy (nobody, cwd with a 4 KiB cache.log) is watched; it exits mid-window and a root
    process takes its pid (ns_last_pid in a fresh pid namespace: deterministic) with a root-only
    cache.log in its cwd. The end-of-window read used to run as root in root's cwd, from byte 0
    (the file looked rotated), and showed ROOT-SECRET. It must find the process gone."""
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", str(REPO / ".venv/bin/python"), "-c",
                        RECYCLE, str(REPO / "tests"), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert "ROOT-SECRET" not in r.stdout
    assert r.returncode == 0, r.stderr
    assert "READ:''" in r.stdout and "WHY:pid" in r.stdout and "has exited" in r.stdout

"""Best-effort logging is best effort (issue 27, item 6).

The apply and rollback record (tune/eventlog.py) is sent as root: a byte that is
not UTF-8 in SUDO_USER or in a profile's path turned a finished apply into
`internal error`, rc 2, with no record at all; and a socket named by the
environment (`sudo -E` keeps PROXYTUNE_*_SOCKET) was trusted whenever root owned
it, so root's record went to whatever root-owned socket a user named, links
followed. Now a named socket counts only in a directory private to us, opened
once without following a link.
"""

import os
import socket
from pathlib import Path

import pytest

from conftest import needs_root
from test_adversarial_apply import PY, LogSocket, run, syslog_fields
from test_adversarial_engine import history, prof  # noqa: F401

pytestmark = needs_root


@pytest.fixture
def journald(tmp_path, monkeypatch):
    """journald's socket stands in here (its native protocol carries every field raw)."""
    s = LogSocket(tmp_path / "journal.sock")
    monkeypatch.setenv("PROXYTUNE_JOURNAL_SOCKET", str(tmp_path / "journal.sock"))
    monkeypatch.setenv("PROXYTUNE_SYSLOG_SOCKET", str(tmp_path / "no-syslog"))
    return s


@pytest.mark.parametrize("where", ["SUDO_USER", "profile path"])
def test_a_byte_that_is_not_utf8_never_fails_a_finished_apply_nor_its_record(sandbox, prof, journald, tmp_path,
                                                                             where):
    env = {}
    path = prof
    if where == "SUDO_USER":
        env["SUDO_USER"] = "eve\udcff"                    # the raw byte 0xff in the environment
    else:
        path = tmp_path / "site\udcffedge.toml"           # the raw byte 0xff in the file's name
        os.rename(prof, path)
    r = run([*PY, "tune", "apply", "-p", str(path), "--service", "squid", "--yes"], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "internal error" not in r.stderr
    (msg,) = journald.messages()
    fields = dict(line.split("=", 1) for line in msg.splitlines())
    assert fields["PROXYTUNE_RESULT"] == "applied", fields
    assert fields["PROXYTUNE_JOURNAL"] == history(sandbox)[-1]["id"], fields
    assert "\\udcff" in fields.get("PROXYTUNE_SUDO_USER", "") + fields["PROXYTUNE_PROFILE"], fields


def root_daemon_socket(where: Path) -> socket.socket:
    """A datagram socket root listens on in a directory anyone may look into (as /run/DAEMON/ is)."""
    where.mkdir(mode=0o755)
    where.chmod(0o755)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(where / "daemon.sock"))
    s.settimeout(0)
    return s


def received(s: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(s.recv(65536))
        except BlockingIOError:
            return out


@pytest.mark.parametrize("how", ["named directly", "through a symlink in a private directory"])
def test_a_root_owned_socket_the_environment_names_outside_a_private_directory_gets_no_record(
        sandbox, prof, tmp_path, monkeypatch, how):
    """`sudo -E` with PROXYTUNE_SYSLOG_SOCKET naming another root daemon's socket (here in a 0755
    directory), or a symlink to it: root's apply record (who, profile, journal) went there."""
    daemon = root_daemon_socket(tmp_path / "run-daemon")
    named = tmp_path / "run-daemon" / "daemon.sock"
    if how.startswith("through"):
        private = tmp_path / "private"
        private.mkdir(mode=0o700)
        (private / "log.sock").symlink_to(named)
        named = private / "log.sock"
    monkeypatch.setenv("PROXYTUNE_SYSLOG_SOCKET", str(named))
    monkeypatch.setenv("PROXYTUNE_JOURNAL_SOCKET", str(tmp_path / "no-journald"))
    r = run([*PY, "tune", "apply", "-p", str(prof), "--service", "squid", "--yes"])
    assert r.returncode == 0, r.stderr
    assert received(daemon) == []
    assert "PROXYTUNE_SYSLOG_SOCKET" in r.stderr, r.stderr     # said once, not silently dropped


# ---------------------------------------------------------------- second attack round

def test_a_huge_sudo_user_and_a_socket_path_longer_than_sun_path_still_log_one_bounded_line(sandbox, prof,
                                                                                             tmp_path, monkeypatch):
    """A unix socket path is at most 107 bytes (sun_path): a private one deeper than that was never
    reachable; a 64 KiB SUDO_USER must not make the line (or the journal entry) huge."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True, mode=0o700)
    cwd = os.getcwd()
    os.chdir(deep)                              # bind by a short relative name: the socket's path is > 108 bytes
    try:
        sock = LogSocket(Path("log.sock"))
    finally:
        os.chdir(cwd)
    assert len(str(deep / "log.sock")) > 108
    monkeypatch.setenv("PROXYTUNE_SYSLOG_SOCKET", str(deep / "log.sock"))
    monkeypatch.setenv("PROXYTUNE_JOURNAL_SOCKET", str(tmp_path / "no-journald"))
    r = run([*PY, "tune", "apply", "-p", str(prof), "--service", "squid", "--yes"], env={"SUDO_USER": "x" * 65536})
    assert r.returncode == 0, r.stderr
    (msg,) = sock.messages()
    assert len(msg) < 4096 and syslog_fields(msg)["result"] == "applied", msg[:200]


def test_a_refused_socket_with_stderr_closed_still_finishes_the_apply(sandbox, prof, tmp_path, monkeypatch):
    """nohup-like: stderr is gone when the refusal is said. The apply is done; it must say rc 0."""
    daemon = root_daemon_socket(tmp_path / "run-daemon")
    monkeypatch.setenv("PROXYTUNE_SYSLOG_SOCKET", str(tmp_path / "run-daemon" / "daemon.sock"))
    monkeypatch.setenv("PROXYTUNE_JOURNAL_SOCKET", str(tmp_path / "no-journald"))
    import subprocess
    r = subprocess.run([*PY, "tune", "apply", "-p", str(prof), "--service", "squid", "--yes"], stderr=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, text=True, timeout=120, env=os.environ.copy(),
                       preexec_fn=lambda: os.close(2))
    assert r.returncode == 0 and "PROXYTUNE_SYSLOG_SOCKET" not in r.stdout, r.stdout   # not said on stdout instead
    assert received(daemon) == []

"""Adversarial cases for host-wide safety of apply and rollback (issue 20, Deliver 5; issue 19):
two applies with two state dirs at once, a step that failed before its write, a full or
read-only state filesystem under rollback, an ssh drop (SIGHUP) mid-apply, and the
journal/syslog line each apply and rollback leaves.

Every case asserts the exit code, the one-line message and what the host holds afterwards."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CLI, IS_ROOT, REPO, in_netns, needs_root
from test_adversarial_engine import (DROPIN, LIMITS_FILE, NOBODY, diff, history, one_error, snap,  # noqa: F401
                                     prof, wait_stopped)

PY = [sys.executable, str(CLI)]


def apply_argv(prof, *only):
    return [*PY, "tune", "apply", "-p", str(prof), "--service", "squid", "--yes",
            *[a for o in only for a in ("--only", o)]]


def run(argv, state_dir=None, env=None):
    env = {**os.environ, **({"PROXYTUNE_STATE_DIR": str(state_dir)} if state_dir else {}), **(env or {})}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def start(argv, state_dir=None, fault=None):
    """A real apply in the background; with fault N:stop it stops (holding its locks) after step N."""
    env = {**os.environ, **({"PROXYTUNE_STATE_DIR": str(state_dir)} if state_dir else {})}
    if fault:
        env["PROXYTUNE_FAULT_AFTER_STEP"] = fault
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rollback(state_dir=None, *extra):
    return run([*PY, "tune", "rollback", "--yes", *extra], state_dir)


# ------------------------------------------------------------------ 1. one host-wide lock

@pytest.mark.parametrize("second", ["apply", "rollback"])
def test_a_second_state_dir_does_not_get_round_the_host_lock(sandbox, prof, tmp_path, second):
    """An apply journaling into one state dir is live (stopped after its first step); a second
    writer journaling into another state dir is refused, naming the holder: pid, start, state dir."""
    other = tmp_path / "state2"
    if second == "rollback":        # give the other state dir something open to roll back
        assert run(apply_argv(prof, "limits:*"), other).returncode == 0
    first = start(apply_argv(prof, "service:*"), fault="1:stop")
    try:
        wait_stopped(first.pid)
        before = snap(sandbox)
        before_other = sorted(p.name for p in (other / "journal").glob("*")) if other.exists() else []
        r = run(apply_argv(prof), other) if second == "apply" else rollback(other)
        line = one_error(r, 2, f"tune {second} refused: pid {first.pid} (tune apply", "started ",
                         f"state dir {sandbox.state_dir})", "holds the host lock since")
        assert "interrupted" not in line
        assert diff(before, snap(sandbox), tmp_path) == []
        assert (sorted(p.name for p in (other / "journal").glob("*")) if other.exists() else []) == before_other
    finally:
        os.kill(first.pid, signal.SIGCONT)
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    r = run(apply_argv(prof), other) if second == "apply" else rollback(other)   # free again
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("second", ["apply", "rollback"])
def test_an_apply_killed_in_another_state_dir_is_rolled_back_first(sandbox, prof, tmp_path, second):
    """SIGKILL leaves the host lock free but its note names a half-done apply in its state dir:
    a writer with another state dir is refused ("interrupted", its pid gone) until that is rolled
    back; a refused retry in the killed apply's own state dir does not erase that memory."""
    other = tmp_path / "state2"
    if second == "rollback":
        assert run(apply_argv(prof, "limits:*"), other).returncode == 0
    killed = start(apply_argv(prof, "service:*"), fault="1")
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    entry = history(sandbox)[-1]
    assert entry["state"] == "interrupted"
    assert run(apply_argv(prof)).returncode == 2       # same state dir: refused by its own journal
    for _ in range(2):
        r = run(apply_argv(prof), other) if second == "apply" else rollback(other)
        one_error(r, 2, f"tune {second} refused: apply {entry['id']} in the state dir {sandbox.state_dir} was "
                        f"interrupted (its pid {killed.pid} is gone)")
        assert f"--state-dir {sandbox.state_dir} tune rollback" in r.stderr
    assert rollback().returncode == 0
    assert not (sandbox.root / DROPIN).exists()
    r = run(apply_argv(prof), other) if second == "apply" else rollback(other)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(not IS_ROOT, reason="chown needs root")
@pytest.mark.parametrize("plant", ["symlink", "owned-by-nobody", "world-writable", "lock-symlink"])
def test_a_planted_host_lock_directory_is_refused(sandbox, prof, tmp_path, plant):
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if plant == "symlink":
        run_dir.symlink_to(elsewhere)
    elif plant == "lock-symlink":
        run_dir.mkdir(mode=0o700)
        (run_dir / "lock").symlink_to(elsewhere / "target")
    else:
        run_dir.mkdir(mode=0o700)
        os.chown(run_dir, NOBODY, NOBODY) if plant == "owned-by-nobody" else run_dir.chmod(0o777)
    before = snap(sandbox)
    r = run(apply_argv(prof))
    one_error(r, 2, *(["cannot open the lock"] if plant == "lock-symlink" else ["the host lock directory"]))
    assert diff(before, snap(sandbox), tmp_path) == [] and list(elsewhere.iterdir()) == []


def test_the_host_lock_directory_is_made_private_whatever_the_umask(sandbox, prof, tmp_path):
    r = subprocess.run(["sh", "-c", 'umask 000; exec "$@"', "sh", *apply_argv(prof)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run").stat().st_mode & 0o7777 == 0o700
    assert (tmp_path / "run/lock").stat().st_mode & 0o7777 == 0o600
    assert (tmp_path / "run/lock").read_text() == ""           # empty: nobody holds it


# ------------------------------------------------------------------ 2. reached = its write was issued

def _plan(sandbox, prof):
    from proxytune.tune import plan as plan_mod
    return plan_mod.build(str(prof), sandbox, {"service": "squid", "user": None, "cache_dirs": []})


@pytest.mark.parametrize("how", ["file-changed", "journal-full"])
def test_a_step_stopped_before_its_write_is_not_undone(sandbox, prof, monkeypatch, how):
    """The admin writes the drop-in while apply is between its steps; then apply stops before
    writing it: the file changed under it, or the journal cannot record that the write is about
    to be issued (full). It undoes step 1 only: the admin's file is neither kept-and-reported nor
    left for a later `rollback --force` to remove."""
    from proxytune.core.errors import ProxytuneError
    from proxytune.tune import apply as apply_mod, journal
    dropin, theirs = sandbox.root / DROPIN, "[Service]\nLimitNOFILE=5000\n"

    def admin_writes():
        dropin.parent.mkdir(parents=True, exist_ok=True)
        dropin.write_text(theirs)
    real_do, real_save = apply_mod._do, journal.save

    def admin_first(step, *a, **kw):
        if step.get("path") == str(dropin):
            admin_writes()
        return real_do(step, *a, **kw)

    def full_at_step_2(state_dir, entry):
        if entry.get("writing") == 2:
            admin_writes()
            raise ProxytuneError(f"cannot write {state_dir}/journal: No space left on device")
        return real_save(state_dir, entry)
    if how == "file-changed":
        monkeypatch.setattr(apply_mod, "_do", admin_first)
    else:
        monkeypatch.setattr(journal, "save", full_at_step_2)
    with pytest.raises(ProxytuneError) as e:
        apply_mod.apply_plan(_plan(sandbox, prof), sandbox)
    why = "changed while this apply ran" if how == "file-changed" else "No space left on device"
    assert why in e.value.message and "undid every step done" in e.value.message, e.value.message
    assert dropin.read_text() == theirs and not (sandbox.root / LIMITS_FILE).exists()
    assert history(sandbox)[-1]["state"] == "failed-undone"
    one_error(rollback(None, "--force"), 2, "nothing to roll back")
    assert dropin.read_text() == theirs


def test_a_step_whose_write_was_recorded_but_failed_midway_is_undone(sandbox, prof, monkeypatch):
    """The other side: the drop-in's write was issued, put the file in place, then failed: it is
    ours (its digest is the one apply wrote) and is removed again."""
    from proxytune.core.errors import ProxytuneError
    from proxytune.tune import apply as apply_mod, files
    dropin, real_write = sandbox.root / DROPIN, files.write

    def write_then_fail(path, *a, **kw):
        created = real_write(path, *a, **kw)
        if Path(path) == dropin:
            raise ProxytuneError(f"cannot write {path}: Input/output error")
        return created
    monkeypatch.setattr(files, "write", write_then_fail)
    with pytest.raises(ProxytuneError) as e:
        apply_mod.apply_plan(_plan(sandbox, prof), sandbox)
    assert "Input/output error" in e.value.message and "undid every step done" in e.value.message
    assert not dropin.exists() and not (sandbox.root / LIMITS_FILE).exists()
    assert history(sandbox)[-1]["state"] == "failed-undone"


def test_rollback_after_a_kill_leaves_the_file_of_a_step_never_started(sandbox, prof):
    """Killed after step 1; then the admin creates the drop-in step 2 would have written:
    rollback removes our limits file, leaves the admin's drop-in, and completes (exit 0)."""
    killed = start(apply_argv(prof), fault="1")
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    dropin = sandbox.root / DROPIN
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text("[Service]\nLimitNOFILE=5000\n")
    r = rollback()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kept" not in r.stdout and dropin.read_text() == "[Service]\nLimitNOFILE=5000\n"
    assert not (sandbox.root / LIMITS_FILE).exists() and history(sandbox)[-1]["state"] == "rolled-back"


@needs_root
def test_rollback_after_a_kill_leaves_a_sysctl_never_started(sandbox):
    """Killed after step 2 of the sysctls; an operator then sets step 3's sysctl: it was never
    ours, so rollback restores steps 1-2, leaves it, and says nothing about it (exit 0)."""
    r = in_netns("""
        echo 4096 > /proc/sys/net/core/somaxconn
        PROXYTUNE_FAULT_AFTER_STEP=2 $PT tune apply -p linux/proxy --only 'sysctl:net.*' --yes >/dev/null 2>&1 || true
        sysctl -qw net.core.somaxconn=5000
        $PT tune rollback --yes 2>&1 && echo "exit=0" || echo "exit=$?"
        sysctl -n net.core.somaxconn
    """)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert "exit=0" in out and out[-1] == "5000", r.stdout
    assert "somaxconn" not in r.stdout
    assert history(sandbox)[-1]["state"] == "rolled-back"


# ------------------------------------------------------------------ 3. rollback on a full state filesystem

SYSCTLS = "cat /proc/sys/net/core/somaxconn /proc/sys/net/ipv4/tcp_fin_timeout"


@needs_root
@pytest.mark.parametrize("fault", ["enospc", "erofs"])
def test_rollback_on_a_full_or_read_only_state_filesystem_undoes_then_says_so(sandbox, tmp_path, fault):
    """The state dir is a 256k tmpfs that fills up (or goes read-only) after the apply: rollback
    still takes its locks, undoes every step, then says in one line that the journal could not
    be saved; once there is room, a second rollback records it."""
    (sandbox.root / "etc/security").mkdir(parents=True)
    (sandbox.root / "etc/security/limits.conf").write_text("# site\n")
    out = tmp_path / "out"
    out.mkdir()
    spoil = ("dd if=/dev/zero of=$S/fill bs=4k 2>/dev/null || true" if fault == "enospc"
             else "mount -o remount,ro $S")
    heal = "rm $S/fill" if fault == "enospc" else "mount -o remount,rw $S"
    script = f"""
S=$PROXYTUNE_STATE_DIR; mkdir -p $S
mount -t tmpfs -o size=256k,mode=0700 tmpfs $S
echo 4096 > /proc/sys/net/core/somaxconn; echo 60 > /proc/sys/net/ipv4/tcp_fin_timeout
{SYSCTLS} > {out}/before
$PT tune apply --only 'sysctl:net.core.somaxconn' --only 'sysctl:net.ipv4.tcp_fin_timeout' --only 'limits:*' \\
    --user proxy --persist --yes >/dev/null
{spoil}
set +e; $PT tune rollback --yes >{out}/stdout 2>{out}/stderr; echo $? > {out}/rc; set -e
{SYSCTLS} > {out}/after
ls $PROXYTUNE_ROOT/etc/security/limits.d 2>/dev/null > {out}/limits_d || true
{heal}
$PT tune rollback --yes > {out}/second 2>&1; $PT tune history --json > {out}/history
"""
    r = subprocess.run(["unshare", "-m", "-n", "bash", "-euo", "pipefail", "-c", script], capture_output=True,
                       text=True, env={**os.environ, "PT": " ".join(PY)}, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    res = subprocess.CompletedProcess([], int((out / "rc").read_text()), "", (out / "stderr").read_text())
    why = "No space left on device" if fault == "enospc" else "Read-only file system"
    one_error(res, 2, "rolled back 4 step(s)", "the journal could not be saved", why, "still says applied")
    assert (out / "before").read_text() == (out / "after").read_text() != ""
    assert (out / "limits_d").read_text() == ""
    assert json.loads((out / "history").read_text())["data"]["entries"][-1]["state"] == "rolled-back"


# ------------------------------------------------------------------ 4. SIGHUP (an ssh drop) mid-apply and mid-rollback

NET = ("--only", "sysctl:net.core.somaxconn", "--only", "sysctl:net.ipv4.tcp_fin_timeout",
       "--only", "sysctl:net.ipv4.tcp_max_syn_backlog")


@needs_root
@pytest.mark.parametrize("after_step", [1, 3])
def test_sighup_mid_apply_undoes_and_says_so(sandbox, tmp_path, after_step):
    """A real apply stopped after step N gets SIGHUP (then SIGCONT): like SIGTERM, it undoes
    every step it wrote, says so in one line, and exits 130."""
    out = tmp_path
    script = f"""
echo 4096 > /proc/sys/net/core/somaxconn; echo 60 > /proc/sys/net/ipv4/tcp_fin_timeout
{SYSCTLS} /proc/sys/net/ipv4/tcp_max_syn_backlog > $OUT/before
PROXYTUNE_FAULT_AFTER_STEP={after_step}:stop $PT tune apply {' '.join(NET)} --persist --yes >/dev/null 2>$OUT/err &
pid=$!
for i in $(seq 600); do [ "$(cut -d' ' -f3 /proc/$pid/stat)" = T ] && break; sleep 0.05; done
[ "$(cut -d' ' -f3 /proc/$pid/stat)" = T ] || {{ kill -9 $pid; echo "apply never stopped at its fault" >&2; exit 1; }}
kill -HUP $pid; kill -CONT $pid
set +e; wait $pid; echo $? > $OUT/rc; set -e
{SYSCTLS} /proc/sys/net/ipv4/tcp_max_syn_backlog > $OUT/after
"""
    r = in_netns(script, env={"OUT": str(out)})
    assert r.returncode == 0, r.stderr
    res = subprocess.CompletedProcess([], int((out / "rc").read_text()), "", (out / "err").read_text())
    one_error(res, 130, "interrupted by SIGHUP", "undid every step done")
    assert (out / "before").read_text() == (out / "after").read_text()
    assert not (sandbox.root / "etc/sysctl.d/90-proxytune.conf").exists()
    assert history(sandbox)[-1]["state"] == "failed-undone"


CHILD_ROLLBACK = """
import importlib.machinery, importlib.util, os, signal, sys
spec = importlib.machinery.ModuleSpec("proxytune", None, is_package=True)
spec.submodule_search_locations = [{repo!r}]
sys.modules["proxytune"] = importlib.util.module_from_spec(spec)
from proxytune.tune import files
real = files.restore
def restore(*a, **kw):
    os.kill(os.getpid(), signal.{sig})      # the ssh session drops in the middle of the undo
    return real(*a, **kw)
files.restore = restore
sys.argv = ["proxytune", "tune", "rollback", "--yes"]
from proxytune.cli import run
run()
"""


@pytest.mark.parametrize("sig", ["SIGHUP", "SIGTERM"])
def test_a_hangup_mid_rollback_does_not_stop_the_undo(sandbox, prof, sig):
    """SIGHUP (like SIGTERM) arriving while rollback undoes: it finishes and records it."""
    assert run(apply_argv(prof)).returncode == 0
    r = subprocess.run([sys.executable, "-c", CHILD_ROLLBACK.format(repo=str(REPO), sig=sig)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout + r.stderr)
    assert not (sandbox.root / DROPIN).exists() and not (sandbox.root / LIMITS_FILE).exists()
    assert history(sandbox)[-1]["state"] == "rolled-back"


# ------------------------------------------------------------------ 5. a line in the journal / syslog

class LogSocket:
    """A unix datagram socket this test owns, standing in for /dev/log or journald's socket."""

    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0)

    def messages(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.sock.recv(65536).decode())
            except BlockingIOError:
                return out


def syslog_fields(msg: str) -> dict:
    """`<13>proxytune[PID]: action=apply uid=0 ...` as a dict (values may be JSON-quoted)."""
    import shlex
    head, _, body = msg.partition(": ")
    assert head.startswith("<") and "proxytune[" in head, msg
    return dict(part.split("=", 1) for part in shlex.split(body))


@pytest.fixture
def logs(tmp_path, monkeypatch):
    """Where apply and rollback log: syslog is the test's socket, journald absent (as here)."""
    s = LogSocket(tmp_path / "log.sock")
    monkeypatch.setenv("PROXYTUNE_SYSLOG_SOCKET", str(tmp_path / "log.sock"))
    monkeypatch.setenv("PROXYTUNE_JOURNAL_SOCKET", str(tmp_path / "no-journald"))
    return s


@pytest.mark.parametrize("sudo_user", ["alice", "eve\nproxytune[1]: action=rollback result=ok \x1b[2J"])
def test_apply_and_rollback_each_leave_one_syslog_line(sandbox, prof, logs, sudo_user):
    """Who (uid, user, SUDO_USER), profile, steps, result: one line each, also when SUDO_USER
    tries to forge a second line or carry terminal escapes."""
    assert run(apply_argv(prof), env={"SUDO_USER": sudo_user}).returncode == 0
    assert rollback().returncode == 0
    msgs = logs.messages()
    assert len(msgs) == 2 and all("\n" not in m and "\x1b" not in m for m in msgs), msgs
    applied, rolled = map(syslog_fields, msgs)
    entry = history(sandbox)[-1]["id"]
    assert applied["action"] == "apply" and applied["result"] == "applied" and applied["steps"] == "2"
    assert applied["uid"] == str(os.getuid()) and applied["profile"] == str(prof) and applied["journal"] == entry
    assert applied["sudo_user"].startswith("eve\\nproxytune" if "\n" in sudo_user else "alice")
    assert rolled["action"] == "rollback" and rolled["result"] == "rolled-back" and rolled["journal"] == entry
    assert "sudo_user" not in rolled


@pytest.mark.parametrize("how", ["failure", "refused"])
def test_a_failed_or_refused_apply_is_logged_with_its_reason(sandbox, prof, logs, how):
    if how == "failure":        # the drop-in directory is a file: step 2 fails, step 1 is undone
        (sandbox.root / "etc/systemd/system").mkdir(parents=True)
        (sandbox.root / "etc/systemd/system/squid.service.d").write_text("not a directory\n")
        r = run(apply_argv(prof))
    else:
        killed = start(apply_argv(prof), fault="1")
        killed.communicate(timeout=60)
        logs.messages()
        r = run(apply_argv(prof))
    assert r.returncode == 2
    fields = syslog_fields(logs.messages()[-1])
    assert fields["action"] == "apply" and fields["result"] == "failed", fields
    assert ("Not a directory" if how == "failure" else "was interrupted") in fields["reason"]
    assert fields.get("done", "0") == "1" if how == "failure" else "journal" not in fields


def test_with_journald_the_line_carries_searchable_fields(sandbox, prof, tmp_path, monkeypatch):
    journald = LogSocket(tmp_path / "journal.sock")
    monkeypatch.setenv("PROXYTUNE_JOURNAL_SOCKET", str(tmp_path / "journal.sock"))
    assert run(apply_argv(prof), env={"SUDO_USER": "alice"}).returncode == 0
    (msg,) = journald.messages()
    fields = dict(line.split("=", 1) for line in msg.splitlines())
    assert fields["SYSLOG_IDENTIFIER"] == "proxytune" and fields["PRIORITY"] == "5"
    assert fields["PROXYTUNE_ACTION"] == "apply" and fields["PROXYTUNE_RESULT"] == "applied"
    assert fields["PROXYTUNE_SUDO_USER"] == "alice" and fields["PROXYTUNE_STEPS"] == "2"
    assert fields["MESSAGE"].startswith("proxytune: action=apply uid=")


# ------------------------------------------------------------------ 5. status, and "needs root"

def status(*extra):
    return run([*PY, "status", *extra])


def test_status_says_what_is_applied_by_whom_and_what_drifted(sandbox, prof):
    r = status()
    assert r.returncode == 0 and "nothing applied" in r.stdout, r.stdout + r.stderr
    assert run(apply_argv(prof), env={"SUDO_USER": "alice"}).returncode == 0
    r = status("--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["kind"] == "status" and doc["schema"] == "proxytune.result/1"
    (e,) = doc["data"]["applied"]
    assert e["profile"] == str(prof) and e["state"] == "applied" and e["steps"] == 2 and e["drift"] == []
    assert e["by"]["sudo_user"] == "alice" and e["by"]["uid"] == os.getuid()
    assert e["journal"] == history(sandbox)[-1]["id"]
    (sandbox.root / DROPIN).write_text("[Service]\nLimitNOFILE=1024\n")      # an admin edits our drop-in
    (sandbox.root / LIMITS_FILE).unlink()                                     # and removes our limits file
    r = status()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "2 drifted since" in r.stdout and "(sudo alice)" in r.stdout
    assert f"drift: {sandbox.root / DROPIN}: edited (sha256 " in r.stdout
    assert f"drift: {sandbox.root / LIMITS_FILE}: removed" in r.stdout
    assert rollback(None, "--force").returncode == 0
    assert status().returncode == 0


@needs_root
def test_status_names_a_sysctl_changed_since_and_an_interrupted_apply(sandbox):
    r = in_netns("""
        echo 4096 > /proc/sys/net/core/somaxconn
        $PT tune apply --only 'sysctl:net.core.somaxconn' --yes >/dev/null
        $PT status >/dev/null && echo "clean=0" || echo "clean=$?"
        sysctl -qw net.core.somaxconn=5000
        $PT status && echo "exit=0" || echo "exit=$?"
        PROXYTUNE_FAULT_AFTER_STEP=0 $PT tune apply --only 'sysctl:net.ipv4.tcp_fin_timeout' --yes >/dev/null 2>&1 || true
        $PT status --json > $OUT/status.json || true
    """, env={"OUT": str(sandbox.root.parent)})
    assert r.returncode == 0, r.stderr
    assert "clean=0" in r.stdout and "exit=1" in r.stdout, r.stdout
    assert "drift: sysctl:net.core.somaxconn: now 5000, applied 8192" in r.stdout
    doc = json.loads((sandbox.root.parent / "status.json").read_text())
    first, killed = doc["data"]["applied"]
    assert (first["state"], killed["state"]) == ("applied", "interrupted")
    assert killed["steps"] == 0 and killed["drift"] == []      # killed before its first write: nothing of it holds


@needs_root
@pytest.mark.parametrize("where", ["root-only-parent", "root-owned-state-dir"])
def test_a_user_reading_roots_journal_is_told_it_needs_root_not_to_chown_it(sandbox, prof, tmp_path, where,
                                                                          as_nobody):
    """Not `it must be owned by uid 65534`: that invites chowning root's journal to the user."""
    applied = run(apply_argv(prof))
    assert applied.returncode == 0, applied.stderr
    state = sandbox.state_dir
    if where == "root-owned-state-dir":          # a state dir the user can reach, but root's
        import tempfile
        public = Path(tempfile.mkdtemp(prefix="pt-public-"))
        try:
            public.chmod(0o755)
            state = public / "state"
            subprocess.run(["cp", "-a", str(sandbox.state_dir), str(state)], check=True)
            results = _as_nobody(as_nobody, state)
        finally:
            subprocess.run(["rm", "-rf", str(public)], check=True)
    else:
        results = _as_nobody(as_nobody, state)
    for r in results:
        line = one_error(r, 2, "needs root")
        assert "65534" not in line.split("(running as uid")[0] and "chown" not in r.stderr
        assert "must be owned by" not in r.stderr and "run it as root" in r.stderr


def _as_nobody(as_nobody, state: Path) -> list:
    return [as_nobody(*argv, env={"PROXYTUNE_STATE_DIR": str(state)})
            for argv in (("tune", "history"), ("status",), ("tune", "rollback", "--yes"))]


def test_an_ssh_drop_on_the_terminal_mid_apply_undoes_and_logs_it(sandbox, prof, logs):
    """apply runs on a terminal (its controlling tty, as under ssh) and is held after step 1;
    the terminal goes away: the kernel sends SIGHUP. It undoes step 1 although it can no
    longer write a word to the terminal, exits 130, and the syslog line says what happened."""
    import pty
    master, slave = pty.openpty()
    env = {**os.environ, "PROXYTUNE_FAULT_AFTER_STEP": "1:stop"}
    p = subprocess.Popen(["setsid", "--ctty", *apply_argv(prof)], stdin=slave, stdout=slave, stderr=slave,
                         env=env)
    os.close(slave)
    try:
        wait_stopped(p.pid)
        assert (sandbox.root / LIMITS_FILE).exists()
        os.close(master)                      # the ssh session drops: hangup on the terminal
        master = None
        assert p.wait(timeout=60) == 130
    finally:
        if master is not None:
            os.close(master)
        if p.poll() is None:
            p.kill()
            p.wait()
    assert not (sandbox.root / LIMITS_FILE).exists() and not (sandbox.root / DROPIN).exists()
    assert history(sandbox)[-1]["state"] == "failed-undone"
    fields = syslog_fields(logs.messages()[-1])
    assert fields["result"] == "interrupted" and "SIGHUP" in fields["reason"], fields


@pytest.mark.parametrize("fault", ["1", "0:bug"])
def test_the_installed_cli_has_no_fault_switch(sandbox, prof, fault):
    """PROXYTUNE_FAULT_AFTER_STEP only means something to tests/faulty_cli.py: cli.py ignores it."""
    argv = [sys.executable, str(REPO / "cli.py"), *apply_argv(prof)[2:]]
    r = run(argv, env={"PROXYTUNE_FAULT_AFTER_STEP": fault})
    assert r.returncode == 0, r.stderr
    assert history(sandbox)[-1]["state"] == "applied" and (sandbox.root / DROPIN).exists()


@needs_root
@pytest.mark.parametrize("fault", ["enospc", "erofs"])
def test_apply_on_a_full_or_read_only_state_filesystem_changes_nothing(sandbox, prof, tmp_path, fault):
    """Second attack round: the state fs is already full (or read-only) when apply starts: the
    journal cannot be written (or the lock not even created), so nothing may change."""
    spoil = ("dd if=/dev/zero of=$S/fill bs=4k 2>/dev/null || true" if fault == "enospc"
             else "mount -o remount,ro $S")
    before = snap(sandbox)
    script = f"""S=$PROXYTUNE_STATE_DIR; mkdir -p $S; mount -t tmpfs -o size=64k,mode=0700 tmpfs $S; {spoil}
set +e; {' '.join(apply_argv(prof))} 2>$OUT/err; echo $? > $OUT/rc"""
    r = subprocess.run(["unshare", "-m", "bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                       env={**os.environ, "OUT": str(tmp_path)}, timeout=120)
    assert r.returncode == 0, r.stderr
    res = subprocess.CompletedProcess([], int((tmp_path / "rc").read_text()), "", (tmp_path / "err").read_text())
    one_error(res, 2, "No space left on device" if fault == "enospc" else "Read-only file system")
    if fault == "erofs":
        assert "hint: its filesystem is read-only or full; nothing was changed" in res.stderr
    assert diff(before, snap(sandbox), tmp_path) == []


# ------------------------------------------- the syslog record: never to a socket another user owns

@needs_root
@pytest.mark.parametrize("owner", ["nobody", "root"])
def test_a_log_socket_another_user_owns_never_gets_roots_record(sandbox, prof, tmp_path, monkeypatch, owner):
    """PROXYTUNE_SYSLOG_SOCKET kept by `sudo -E` naming a user's socket: root's apply record (who,
    profile, journal id) is not sent to that user; root's own socket still gets it."""
    import pwd
    path = tmp_path / "log.sock"
    sock = LogSocket(path)
    if owner == "nobody":
        os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
    monkeypatch.setenv("PROXYTUNE_SYSLOG_SOCKET", str(path))
    monkeypatch.setenv("PROXYTUNE_JOURNAL_SOCKET", str(tmp_path / "no-journald"))
    assert run(apply_argv(prof)).returncode == 0
    assert rollback().returncode == 0
    assert len(sock.messages()) == (0 if owner == "nobody" else 2)

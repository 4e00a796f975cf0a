"""Adversarial cases for the tune engine (issue 10, items 1-4 and 8): a second run
while one is live, planted and damaged journal entries, later changes by hand,
symlinks where our files go, a full or read-only journal, Ctrl-C and bugs mid-apply.

Each case asserts the exit code, the one-line message, and that the sandbox is
exactly as before or exactly as documented (tests/snapshot.py). Temp-directory
leftovers, mounts and loop devices of *other* runs on this shared machine are
ignored: tune writes its temp files only beside its targets (covered by the file
snapshot) and mounts nothing."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CLI, IS_ROOT, in_netns, needs_root, proxytune, wait_exec
from snapshot import SandboxState
from test_adversarial_profiles import AS_NOBODY, nobody_dir  # noqa: F401
from proxytune.core.procfs import identity

FILES_PROFILE = ('[profile]\nos = "linux"\n'
                 '[limits."proxy:nofile"]\nat_least = 70000\nreason = "t"\nsource = "t"\n'
                 '[service."squid:LimitNOFILE"]\nat_least = 70000\nreason = "t"\nsource = "t"\n')
LIMITS_FILE = "etc/security/limits.d/90-proxytune.conf"
DROPIN = "etc/systemd/system/squid.service.d/50-proxytune.conf"
NOBODY = 65534


# ------------------------------------------------------------------ helpers

@pytest.fixture
def prof(sandbox, tmp_path):
    """A file-only profile (limits.d + a systemd drop-in): needs no root, no namespace."""
    p = tmp_path / "files.toml"
    p.write_text(FILES_PROFILE)
    (sandbox.root / "etc/security").mkdir(parents=True)
    (sandbox.root / "etc/security/limits.conf").write_text("# site limits\n")
    return p


def apply_files(prof, *extra, env=None):
    return proxytune("tune", "apply", "-p", str(prof), "--service", "squid", "--yes", *extra, env=env)


def snap(sandbox, sysctl_names=()):
    return SandboxState.take(sandbox.root, sandbox.state_dir, sysctl_names=sysctl_names)


def diff(before, after, tmp_path):
    """Differences this run could have caused (see the module docstring)."""
    lines = before.diff(after)
    return [x for x in lines if x.startswith(("file ", "sysctl ")) or str(tmp_path) in x]


def one_error(r, code, *needles, kind="error"):
    """Exactly one `proxytune: KIND: ...` line (plus an optional hint line), no traceback."""
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines and lines[0].startswith(f"proxytune: {kind}: "), r.stderr
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def entry_files(sandbox):
    return sorted((sandbox.state_dir / "journal").glob("*.json"))


def history(sandbox):
    r = proxytune("tune", "history", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["data"]["entries"]


def edit_entry(path: Path, change) -> None:
    """Rewrite a journal entry as root would have written it (0600, ours), with `change` applied."""
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def wait_stopped(pid: int, timeout: float = 60) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never stopped")


@pytest.fixture
def sleeper(tmp_path):
    """A live process the test owns (for 'alive owner' and rlimit cases)."""
    exe = tmp_path / "ptsleeper"
    exe.write_bytes(Path("/bin/sleep").read_bytes())
    exe.chmod(0o755)
    p = subprocess.Popen(["prlimit", "--nofile=1024:4096", str(exe), "120"])
    wait_exec(p, exe.name)
    yield p
    p.kill()
    p.wait()


def dead_identity():
    p = subprocess.Popen(["sleep", "60"])
    who = identity(p.pid)
    p.kill()
    p.wait()
    return who


# ------------------------------------------------------------------ 1. one writer at a time

@pytest.mark.parametrize("second", ["apply", "rollback"])
def test_second_writer_is_refused_while_an_apply_is_live(sandbox, prof, tmp_path, second):
    env = {**os.environ, "PROXYTUNE_FAULT_AFTER_STEP": "1:stop"}
    first = subprocess.Popen([sys.executable, str(CLI), "tune", "apply", "-p", str(prof), "--service", "squid",
                              "--yes"], cwd=Path(__file__).parent.parent, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_stopped(first.pid)
        before = snap(sandbox)
        r = apply_files(prof) if second == "apply" else proxytune("tune", "rollback", "--yes")
        one_error(r, 2, f"tune {second} refused: pid {first.pid} (tune apply", "holds the host lock since")
        assert diff(before, snap(sandbox), tmp_path) == []
        assert history(sandbox)[-1]["state"] == "in-progress"
    finally:
        os.kill(first.pid, signal.SIGCONT)
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert history(sandbox)[-1]["state"] == "applied"
    assert proxytune("tune", "rollback", "--yes").returncode == 0
    assert not (sandbox.root / LIMITS_FILE).exists() and not (sandbox.root / DROPIN).exists()


def test_under_nohup_a_hangup_mid_apply_undoes_nothing(sandbox, prof):
    """nohup ignores SIGHUP so that the apply outlives its ssh session: the hangup after step 1
    must not undo it (without nohup it does: test_an_ssh_drop_on_the_terminal_mid_apply_undoes_and_logs_it)."""
    env = {**os.environ, "PROXYTUNE_FAULT_AFTER_STEP": "1:stop"}
    held = subprocess.Popen(["nohup", sys.executable, str(CLI), "tune", "apply", "-p", str(prof), "--service",
                             "squid", "--yes"], cwd=Path(__file__).parent.parent, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_stopped(held.pid)
        os.kill(held.pid, signal.SIGHUP)
    finally:
        os.kill(held.pid, signal.SIGCONT)
        out, err = held.communicate(timeout=60)
    assert held.returncode == 0, err
    assert history(sandbox)[-1]["state"] == "applied"
    assert (sandbox.root / LIMITS_FILE).exists() and (sandbox.root / DROPIN).exists()


def test_lock_file_planted_as_symlink_is_refused(sandbox, prof, tmp_path):
    sandbox.state_dir.mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    target.write_text("x\n")
    (sandbox.state_dir / "lock").symlink_to(target)
    before = snap(sandbox)
    one_error(apply_files(prof), 2, "cannot open the lock", "lock")
    assert diff(before, snap(sandbox), tmp_path) == [] and target.read_text() == "x\n"


def _make_applying(sandbox, prof, owner):
    """A real entry, then marked as an apply still 'applying' owned by `owner`."""
    assert apply_files(prof).returncode == 0
    f = entry_files(sandbox)[-1]
    edit_entry(f, lambda d: d.update(state="applying", owner=owner))
    return f


@pytest.mark.parametrize("command", ["apply", "rollback"])
def test_entry_of_a_live_apply_is_in_progress_not_interrupted(sandbox, prof, tmp_path, sleeper, command):
    f = _make_applying(sandbox, prof, identity(sleeper.pid))
    before = snap(sandbox)
    r = apply_files(prof) if command == "apply" else proxytune("tune", "rollback", "--yes")
    one_error(r, 2, f"{command} refused: apply {f.stem} is in progress (pid {sleeper.pid}, 'ptsleeper'")
    assert diff(before, snap(sandbox), tmp_path) == []
    assert history(sandbox)[-1]["state"] == "in-progress"


@pytest.mark.parametrize("owner", ["dead", "recycled-pid"])
def test_entry_whose_owner_is_gone_is_interrupted(sandbox, prof, tmp_path, sleeper, owner):
    who = dead_identity() if owner == "dead" else {**identity(sleeper.pid), "start": 1}
    f = _make_applying(sandbox, prof, who)
    before = snap(sandbox)
    one_error(apply_files(prof), 2, f"apply {f.stem} was interrupted (its pid {who['pid']} is gone)")
    assert diff(before, snap(sandbox), tmp_path) == []
    assert history(sandbox)[-1]["state"] == "interrupted"
    r = proxytune("tune", "rollback", "--yes")
    assert r.returncode == 0, r.stderr
    assert not (sandbox.root / LIMITS_FILE).exists() and history(sandbox)[-1]["state"] == "rolled-back"


# ------------------------------------------------------------------ 2. the journal is untrusted input

def _plant(sandbox, prof, change):
    assert apply_files(prof).returncode == 0
    f = entry_files(sandbox)[-1]
    change(f)
    return f


PLANTS = {
    "owned-by-nobody": (lambda f: os.chown(f, NOBODY, NOBODY), "owned by uid 65534"),
    "group-writable": (lambda f: f.chmod(0o620), "mode 0620"),
    "other-writable": (lambda f: f.chmod(0o602), "mode 0602"),
    "bad-schema": (lambda f: edit_entry(f, lambda d: d["steps"][0].update(kind="shell")), "wrong shape"),
    "not-json": (lambda f: f.write_text("{nope"), "wrong shape"),
    "id-mismatch": (lambda f: f.rename(f.with_name("20260101T000000-1-1.json")), "its id is"),
}


@pytest.mark.skipif(not IS_ROOT, reason="chown needs root")
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_planted_or_damaged_entry_is_refused_naming_the_file(sandbox, prof, tmp_path, plant):
    change, needle = PLANTS[plant]
    _plant(sandbox, prof, change)
    f = entry_files(sandbox)[-1]
    before = snap(sandbox)
    for args in (("tune", "rollback", "--yes"), ("tune", "history")):
        one_error(proxytune(*args), 2, f"refusing journal entry {f}", needle)
    assert diff(before, snap(sandbox), tmp_path) == []


def _escape(rel):
    def change(f):
        edit_entry(f, lambda d: d["steps"][0].update(path=rel(d)))
    return change


ESCAPES = {
    "etc-shadow": (lambda d: d["root"] + "/etc/shadow", "is not a file the limits backend writes"),
    "dotdot": (lambda d: d["root"] + "/etc/security/limits.d/../../shadow", "not a normalised"),
    "outside-root": (lambda d: "/etc/security/limits.d/90-proxytune.conf", "outside the root"),
}


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_entry_naming_a_path_its_backend_never_writes_is_refused(sandbox, prof, tmp_path, escape):
    rel, needle = ESCAPES[escape]
    shadow = sandbox.root / "etc/shadow"
    shadow.write_text("root:secret:::\n")
    shadow.chmod(0o600)
    f = _plant(sandbox, prof, _escape(rel))
    before = snap(sandbox)
    one_error(proxytune("tune", "rollback", "--yes"), 2, f"refusing journal entry {f.stem}", needle)
    assert diff(before, snap(sandbox), tmp_path) == []
    assert shadow.read_text() == "root:secret:::\n"


@pytest.mark.parametrize("state_dir", ["symlinked-journal", "symlinked-state", "world-writable"])
def test_unsafe_state_directory_is_refused(sandbox, prof, tmp_path, state_dir):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if state_dir == "symlinked-journal":
        sandbox.state_dir.mkdir(mode=0o700)
        (sandbox.state_dir / "journal").symlink_to(elsewhere)
    elif state_dir == "symlinked-state":
        sandbox.state_dir.symlink_to(elsewhere)
    else:
        sandbox.state_dir.mkdir()
        sandbox.state_dir.chmod(0o777)
    before = snap(sandbox)
    one_error(apply_files(prof), 2, "refusing the state directory")
    one_error(proxytune("tune", "history"), 2, "refusing the state directory")
    assert diff(before, snap(sandbox), tmp_path) == [] and list(elsewhere.iterdir()) == []


def test_umask_000_still_gives_private_journal_and_documented_modes(sandbox, prof, tmp_path):
    r = subprocess.run(["sh", "-c", 'umask 000; exec "$@"', "sh", sys.executable, "cli.py", "tune", "apply",
                        "-p", str(prof), "--service", "squid", "--yes"], cwd=Path(__file__).parent.parent,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    mode = lambda p: p.stat().st_mode & 0o7777  # noqa: E731
    assert mode(sandbox.state_dir) == 0o700 and mode(sandbox.state_dir / "journal") == 0o700
    assert mode(sandbox.state_dir / "lock") == 0o600 and mode(entry_files(sandbox)[0]) == 0o600
    assert mode(sandbox.root / LIMITS_FILE) == 0o644 and mode(sandbox.root / DROPIN) == 0o644
    assert mode(sandbox.root / "etc/security/limits.d") == 0o755
    assert mode(sandbox.root / "etc/systemd/system/squid.service.d") == 0o755


def test_ids_unique_within_one_second_and_pid_and_ordered_by_sequence(sandbox, prof, tmp_path, monkeypatch):
    """Two applies by one pid in one second (in-process), then sequence numbers past 9999:
    rollback picks the newest by sequence, although its id sorts first as a string.
    The clock is held in one second: two real applies straddle a second boundary now and then
    (CI, 2026-11-27), and then their stamps differ and the collision is not tested."""
    import time as real_time
    from proxytune.tune import apply as apply_mod, journal, plan as plan_mod
    one_second, gmtime = real_time.gmtime(), real_time.gmtime
    ids = []
    with monkeypatch.context() as held:
        held.setattr(real_time, "gmtime", lambda *secs: gmtime(*secs) if secs else one_second)
        for only in ("limits:*", "service:*"):
            plan = plan_mod.build(str(prof), sandbox, {"service": "squid", "user": None, "cache_dirs": []}, (only,))
            ids.append(apply_mod.apply_plan(plan, sandbox).entry["id"])
    assert ids[0] != ids[1] and ids[0].rsplit("-", 2)[:2] == ids[1].rsplit("-", 2)[:2]
    renumbered = {}
    older, newer = (journal.directory(sandbox.state_dir) / f"{i}.json" for i in ids)
    for f, seq in ((older, 9999), (newer, 10000)):
        doc = json.loads(f.read_text())
        doc["seq"], doc["id"] = seq, f"{doc['id'].rsplit('-', 1)[0]}-{seq}"
        f.unlink()
        renumbered[seq] = journal.directory(sandbox.state_dir) / f"{doc['id']}.json"
        renumbered[seq].write_text(json.dumps(doc))
        renumbered[seq].chmod(0o600)
    assert renumbered[10000].name < renumbered[9999].name          # string order would pick 9999
    r = proxytune("tune", "rollback", "--yes", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["data"]["journal"] == renumbered[10000].stem
    assert not (sandbox.root / DROPIN).exists() and (sandbox.root / LIMITS_FILE).exists()


@needs_root
@pytest.mark.parametrize("fault", ["enospc", "erofs"])
def test_journal_write_failure_mid_apply_undoes_and_says_so(sandbox, tmp_path, fault):
    """The journal's filesystem fills up (or goes read-only) after step 1: apply undoes
    step 1, cannot record that, and says so in one line; the host is as before."""
    limits = sandbox.root / "etc/security/limits.conf"
    limits.parent.mkdir(parents=True)
    limits.write_text("# site\n")
    out = tmp_path / "out"
    out.mkdir()
    before = snap(sandbox)
    script = f"""
mkdir -p $PROXYTUNE_STATE_DIR
mount -t tmpfs -o size=256k,mode=0700 tmpfs $PROXYTUNE_STATE_DIR
cat /proc/sys/net/core/somaxconn /proc/sys/net/ipv4/tcp_fin_timeout > {out}/before
PROXYTUNE_FAULT_AFTER_STEP=1:stop $PT tune apply --only 'sysctl:net.core.somaxconn' \\
    --only 'sysctl:net.ipv4.tcp_fin_timeout' --only 'limits:*' --user proxy --persist --yes \\
    >{out}/stdout 2>{out}/stderr &
pid=$!
for i in $(seq 600); do [ "$(cut -d' ' -f3 /proc/$pid/stat)" = T ] && break; sleep 0.05; done
[ "$(cut -d' ' -f3 /proc/$pid/stat)" = T ] || {{ kill -9 $pid; echo "apply never stopped at its fault" >&2; exit 1; }}
if [ {fault} = enospc ]; then dd if=/dev/zero of=$PROXYTUNE_STATE_DIR/fill bs=4k 2>/dev/null || true
else J=$PROXYTUNE_STATE_DIR/journal; mount --bind $J $J; mount -o remount,bind,ro $J; fi
kill -CONT $pid
set +e; wait $pid; echo $? > {out}/rc; set -e
cat /proc/sys/net/core/somaxconn /proc/sys/net/ipv4/tcp_fin_timeout > {out}/after
"""
    r = subprocess.run(["unshare", "-m", "-n", "bash", "-euo", "pipefail", "-c", script], capture_output=True,
                       text=True, env={**os.environ, "PT": f"{sys.executable} {CLI}"},
                       timeout=300)
    assert r.returncode == 0, r.stderr
    res = subprocess.CompletedProcess([], int((out / "rc").read_text()), "", (out / "stderr").read_text())
    why = "No space left on device" if fault == "enospc" else "Read-only file system"
    one_error(res, 2, "apply failed", why, "undid every step done", "the journal could not record it")
    assert (out / "before").read_text() == (out / "after").read_text()
    assert diff(before, snap(sandbox), tmp_path) == []       # the tmpfs went with the namespace


# ------------------------------------------------------------------ 3. rollback restores only what is ours

@needs_root
@pytest.mark.parametrize("force", [False, True])
def test_value_changed_by_hand_after_apply_is_kept_unless_forced(sandbox, force):
    script = f"""
echo 4096 > /proc/sys/net/core/somaxconn
$PT tune apply --only 'sysctl:net.core.somaxconn' --yes >/dev/null
echo 5000 > /proc/sys/net/core/somaxconn
set +e; $PT tune rollback --yes {'--force' if force else ''} >$OUT/stdout 2>$OUT/err; echo $? > $OUT/rc; set -e
cat /proc/sys/net/core/somaxconn
$PT tune history --json > $OUT/history
"""
    out = sandbox.root.parent
    r = in_netns(script, env={"OUT": str(out)})
    assert r.returncode == 0, r.stderr
    state = json.loads((out / "history").read_text())["data"]["entries"][-1]["state"]
    if force:
        assert (out / "rc").read_text().strip() == "0" and r.stdout.split() == ["4096"]
        assert state == "rolled-back"
    else:
        assert (out / "rc").read_text().strip() == "1" and r.stdout.split() == ["5000"]
        assert state == "rollback-incomplete"
        assert "kept: sysctl:net.core.somaxconn was changed since the apply (now 5000)" in (out / "stdout").read_text()


@pytest.mark.parametrize("force", [False, True])
def test_our_file_edited_after_apply_is_kept_unless_forced(sandbox, prof, tmp_path, force):
    assert apply_files(prof).returncode == 0
    ours = sandbox.root / LIMITS_FILE
    ours.write_text("proxy soft nofile 99999  # the admin's own line\n")
    r = proxytune("tune", "rollback", "--yes", *(["--force"] if force else []))
    if force:
        assert r.returncode == 0, r.stderr
        assert not ours.exists() and not (sandbox.root / DROPIN).exists()
        assert history(sandbox)[-1]["state"] == "rolled-back"
        return
    assert r.returncode == 1, r.stderr
    assert f"kept: {ours} was changed since the apply (now sha256 " in r.stdout
    assert "admin's own line" in ours.read_text() and not (sandbox.root / DROPIN).exists()
    assert history(sandbox)[-1]["state"] == "rollback-incomplete"
    r = proxytune("tune", "rollback", "--yes", "--force")          # finishes what is left
    assert r.returncode == 0, r.stderr
    assert not ours.exists() and history(sandbox)[-1]["state"] == "rolled-back"
    assert not (sandbox.root / "etc/security/limits.d").exists()


@needs_root
def test_rlimit_rollback_skips_a_recycled_pid(sandbox, tmp_path, sleeper):
    """Apply raises the sleeper's nofile; the journal then says the pid had another start
    time (as if the pid had been recycled): rollback must leave the process alone."""
    import resource
    p = tmp_path / "nofile.toml"
    p.write_text('[profile]\nos = "linux"\n[rlimit."ptsleeper:nofile"]\nat_least = 4000\nreason = "t"\nsource = "t"\n')
    live = {"PROXYTUNE_ROOT": "/"}          # running processes are read on the live host, never under --root
    r = proxytune("tune", "apply", "-p", str(p), "--yes", env=live)
    assert r.returncode == 0, r.stderr
    raised = resource.prlimit(sleeper.pid, resource.RLIMIT_NOFILE)
    assert raised[0] >= 4000
    f = entry_files(sandbox)[-1]
    edit_entry(f, lambda d: d["steps"][0]["old"][str(sleeper.pid)].update(start=1))
    r = proxytune("tune", "rollback", "--yes", env=live)
    assert r.returncode == 0, r.stderr
    assert f"skipped: pid {sleeper.pid} (ptsleeper) is gone or is another process now" in r.stdout
    assert resource.prlimit(sleeper.pid, resource.RLIMIT_NOFILE) == raised


# ------------------------------------------------------------------ 4. files keep their identity

@pytest.mark.parametrize("where", ["target-file", "parent-dir", "dropin-dir"])
@pytest.mark.parametrize("command", ["plan", "apply"])
def test_symlink_where_our_file_goes_is_refused(sandbox, prof, tmp_path, where, command):
    secret = tmp_path / "secret"
    secret.write_text("token=hunter2\n")
    secret.chmod(0o600)
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    if where == "target-file":
        (sandbox.root / LIMITS_FILE).parent.mkdir(parents=True)
        (sandbox.root / LIMITS_FILE).symlink_to(secret)
    elif where == "parent-dir":
        (sandbox.root / "etc/security/limits.d").symlink_to(decoy)
    else:
        (sandbox.root / "etc/systemd/system").mkdir(parents=True)
        (sandbox.root / "etc/systemd/system/squid.service.d").symlink_to(decoy)
    before = snap(sandbox)
    r = proxytune("tune", command, "-p", str(prof), "--service", "squid", *(["--yes"] if command == "apply" else []))
    one_error(r, 2, "refusing to follow the symlink")
    assert diff(before, snap(sandbox), tmp_path) == []
    assert secret.read_text() == "token=hunter2\n" and list(decoy.iterdir()) == []
    assert "hunter2" not in r.stdout + "".join(f.read_text() for f in entry_files(sandbox))


@pytest.mark.skipif(not IS_ROOT, reason="chown needs root")
def test_rewritten_file_keeps_mode_and_owner_also_after_rollback(sandbox, prof, tmp_path):
    ours = sandbox.root / LIMITS_FILE
    ours.parent.mkdir(parents=True)
    ours.write_text("# kept by the site\n")
    ours.chmod(0o600)
    os.chown(ours, NOBODY, NOBODY)
    before = snap(sandbox)
    assert apply_files(prof).returncode == 0
    st = ours.stat()
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o600, NOBODY, NOBODY)
    assert "70000" in ours.read_text()
    assert proxytune("tune", "rollback", "--yes").returncode == 0
    changed = [x for x in diff(before, snap(sandbox), tmp_path) if str(sandbox.state_dir) not in x]
    assert changed == []


@needs_root
def test_fstab_and_its_backup_keep_0600_nobody(sandbox, loop_ext4, tmp_path):
    img, mnt = loop_ext4
    (mnt / "spool").mkdir()
    fstab = sandbox.root / "etc/fstab"
    fstab.write_text(f"{img}\t{mnt}  ext4  defaults,relatime 0 2\n")
    fstab.chmod(0o600)
    os.chown(fstab, NOBODY, NOBODY)
    before = snap(sandbox)
    r = proxytune("tune", "apply", "--only", "mount:*", "--cache-dir", str(mnt / "spool"), "--persist", "--yes")
    assert r.returncode == 0, r.stderr
    for f in (fstab, sandbox.root / "etc/fstab.proxytune.bak"):
        st = f.stat()
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o600, NOBODY, NOBODY), f
    assert proxytune("tune", "rollback", "--yes").returncode == 0
    assert [x for x in diff(before, snap(sandbox), tmp_path) if str(sandbox.state_dir) not in x] == []


def test_directories_apply_created_are_removed_unless_someone_uses_them(sandbox, prof, tmp_path):
    before = snap(sandbox)
    assert apply_files(prof).returncode == 0
    assert (sandbox.root / "etc/systemd/system/squid.service.d").is_dir()
    (sandbox.root / "etc/security/limits.d/80-site.conf").write_text("* soft core 0\n")
    r = proxytune("tune", "rollback", "--yes")
    assert r.returncode == 0, r.stderr
    assert "kept the directory" in r.stdout and (sandbox.root / "etc/security/limits.d/80-site.conf").exists()
    (sandbox.root / "etc/security/limits.d/80-site.conf").unlink()
    (sandbox.root / "etc/security/limits.d").rmdir()
    assert [x for x in diff(before, snap(sandbox), tmp_path) if str(sandbox.state_dir) not in x] == []


# ------------------------------------------------------------------ 8. exit codes, Ctrl-C, --files-only

NET_ONLY = ("--only", "sysctl:net.core.somaxconn", "--only", "sysctl:net.ipv4.tcp_fin_timeout",
            "--only", "sysctl:net.ipv4.tcp_max_syn_backlog")
DUMP = "cat /proc/sys/net/core/somaxconn /proc/sys/net/ipv4/tcp_fin_timeout /proc/sys/net/ipv4/tcp_max_syn_backlog"


@needs_root
@pytest.mark.parametrize("fault", ["0:int", "1:int", "3:int", "2:term", "4:term"])
def test_interrupt_during_apply_undoes_and_exits_130(sandbox, tmp_path, fault):
    before = snap(sandbox)
    script = f"""
echo 4096 > /proc/sys/net/core/somaxconn; echo 60 > /proc/sys/net/ipv4/tcp_fin_timeout
{DUMP} > $OUT/before
set +e; PROXYTUNE_FAULT_AFTER_STEP={fault} $PT tune apply {' '.join(repr(a) for a in NET_ONLY)} --persist --yes \\
    >/dev/null 2>$OUT/err; echo $? > $OUT/rc; set -e
{DUMP} > $OUT/after
"""
    out = tmp_path
    r = in_netns(script, env={"OUT": str(out)})
    assert r.returncode == 0, r.stderr
    res = subprocess.CompletedProcess([], int((out / "rc").read_text()), "", (out / "err").read_text())
    one_error(res, 130, "interrupted", "undid every step done")
    assert (out / "before").read_text() == (out / "after").read_text()
    assert [x for x in diff(before, snap(sandbox), tmp_path) if str(sandbox.state_dir) not in x] == []
    assert history(sandbox)[-1]["state"] == "failed-undone"


def test_unexpected_exception_is_one_line_exit_2_and_undone(sandbox, prof, tmp_path):
    before = snap(sandbox)
    r = apply_files(prof, env={"PROXYTUNE_FAULT_AFTER_STEP": "1:bug"})
    one_error(r, 2, "InjectedBug: injected fault after step 1", "undid every step done", kind="internal error")
    assert "--debug" in r.stderr
    assert [x for x in diff(before, snap(sandbox), tmp_path) if str(sandbox.state_dir) not in x] == []


def test_debug_shows_the_traceback(sandbox, prof):
    r = proxytune("--debug", "tune", "apply", "-p", str(prof), "--service", "squid", "--yes",
                  env={"PROXYTUNE_FAULT_AFTER_STEP": "1:bug"})
    assert r.returncode == 2
    assert "Traceback (most recent call last)" in r.stderr and "InjectedBug" in r.stderr
    assert not (sandbox.root / LIMITS_FILE).exists()


@needs_root
def test_files_only_writes_files_and_changes_nothing_live(sandbox):
    script = f"""
echo 4096 > /proc/sys/net/core/somaxconn
{DUMP} > $OUT/before
$PT tune plan {' '.join(repr(a) for a in NET_ONLY)} --files-only --json > $OUT/plan.json || true
$PT tune apply {' '.join(repr(a) for a in NET_ONLY)} --files-only --yes --json > $OUT/apply.json || true
{DUMP} > $OUT/after
"""
    out = sandbox.root.parent
    r = in_netns(script, env={"OUT": str(out)})
    assert r.returncode == 0, r.stderr
    assert (out / "before").read_text() == (out / "after").read_text()
    plan = json.loads((out / "plan.json").read_text())["data"]
    assert plan["files_only"] and [s["kind"] for s in plan["steps"]] == ["file"]
    assert any("--files-only: only files are written" in n for n in plan["step_notes"])
    assert any(f"--root {sandbox.root}" in n for n in plan["step_notes"])
    applied = json.loads((out / "apply.json").read_text())["data"]
    assert [s["kind"] for s in applied["steps"]] == ["file"]
    assert "net.core.somaxconn = 8192" in (sandbox.root / "etc/sysctl.d/90-proxytune.conf").read_text()


@pytest.mark.parametrize("argv,needle", [
    (("tune", "rollback", "--id", "../../etc/passwd", "--yes"), "is not a journal id"),
    (("tune", "rollback", "--id", "20260101T000000-1-1", "--yes"), "no journal entry"),
    (("tune", "rollback", "--yes"), "nothing to roll back"),
])
def test_bad_rollback_requests_are_one_line_exit_2(sandbox, tmp_path, argv, needle):
    before = snap(sandbox)
    one_error(proxytune(*argv), 2, needle)
    assert diff(before, snap(sandbox), tmp_path) == []


@pytest.mark.parametrize("argv", [("tune", "apply", "--bogus"), ("tune", "rollback", "--id"),
                                  ("tune", "frobnicate")])
def test_usage_errors_exit_2(sandbox, argv):
    r = proxytune(*argv)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "Error:" in r.stderr


@pytest.mark.parametrize("target", ["fifo", "not-utf8", "directory"])
def test_target_that_is_not_a_text_file_is_refused(sandbox, prof, tmp_path, target):
    """A FIFO must not hang apply (nor the snapshot, which would read it: compared by listing)."""
    ours = sandbox.root / LIMITS_FILE
    ours.parent.mkdir(parents=True)
    if target == "fifo":
        os.mkfifo(ours)
    elif target == "directory":
        ours.mkdir()
    else:
        ours.write_bytes(b"\xff\xfe binary\n")
    listing = lambda: sorted((str(p), p.lstat().st_mode, p.lstat().st_size) for p in sandbox.root.rglob("*"))  # noqa: E731
    before = listing()
    r = proxytune("tune", "apply", "-p", str(prof), "--only", "limits:*", "--yes", timeout=60)
    needle = "not UTF-8 text" if target == "not-utf8" else "not a regular file"
    if r.stderr:
        one_error(r, 2, str(ours), needle)
    else:               # found while reading the host: the plan's status `error`, exit 2, no step run
        assert r.returncode == 2 and "not a regular file" in r.stdout and "applied" not in r.stdout, r.stdout
    assert listing() == before and not entry_files(sandbox)


def test_plan_with_root_says_live_settings_are_this_namespaces(sandbox, prof):
    r = proxytune("tune", "plan", "-p", str(prof), "--service", "squid")
    assert r.returncode == 1, r.stderr                     # drift: the files are missing
    assert f"--root {sandbox.root}: files are read and written under" in r.stdout
    assert "live settings (sysctls, mounts, process limits) are those of the namespace this runs in" in r.stdout
    r = proxytune("tune", "--help")
    assert r.returncode == 0
    r = proxytune("--help")
    assert "namespace" in r.stdout and "--files-only" in r.stdout and "--debug" in r.stdout


# ------------------------------------------- host lock / state dir inside a directory another user owns

@needs_root
@pytest.mark.parametrize("var", ["PROXYTUNE_LOCK_DIR", "PROXYTUNE_STATE_DIR"])
def test_a_lock_or_state_dir_whose_parent_another_user_owns_is_refused(sandbox, prof, cli, nobody_dir, monkeypatch,
                                                                      var):
    """`sudo -E` with PROXYTUNE_LOCK_DIR (or STATE_DIR) under a directory nobody owns: root made the
    directory itself (0700, its own), but nobody can rename it away at any time and let a second
    apply take a fresh lock (two writers at once) or make rollback find no journal. Refused."""
    target = nobody_dir / "pt"
    monkeypatch.setenv(var, str(target))
    r = cli("tune", "apply", "-p", str(prof), "--service", "squid", "--yes")
    assert r.exit_code == 2, r.output
    assert "uid 65534" in r.output and "Traceback" not in r.output
    assert not target.exists()
    assert not (sandbox.root / "etc/security/limits.d").exists()
    # nobody can indeed move what root would have made there: the threat is real
    subprocess.run(AS_NOBODY + ["mkdir", str(target)], check=True)
    subprocess.run(AS_NOBODY + ["mv", str(target), str(nobody_dir / "moved")], check=True)

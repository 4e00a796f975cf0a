"""Second attack round on issue 20: variants not used while building the fix.

Each test is a local user (`nobody`, via setpriv or files it owns) against root
running proxytune, or a tired operator's environment (`sudo -E` keeps PROXYTUNE_*).
"""

import os
import subprocess

import pytest

from conftest import needs_root
from test_adversarial_engine import prof  # noqa: F401
from test_adversarial_profiles import AS_NOBODY, nobody_dir  # noqa: F401

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


# ------------------------------------------- fleet: hostile JSON shapes that pass (or break) the parser

def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("where", ["whole", "current"])
def test_a_host_answer_nested_too_deeply_is_a_failed_host(where):
    """A host prints 100000 nested arrays (json.loads raised RecursionError: the fleet crashed), or a
    schema-valid audit whose setting's free-form `current` is 950 levels deep (it parses, but any later
    json.dumps or render of the host rows from a few frames deeper recurses past Python's limit)."""
    import json
    from test_adversarial_fleet import AUDIT, SETTING, envelope, run_event
    from proxytune.tune import fleet_play as fp, fleet_result
    deep = json.loads(_nested(950))
    if where == "whole":
        stdout = _nested(100000)
    else:
        stdout = envelope("audit", {**AUDIT, "settings": [{**SETTING, "current": deep}]})
    r = fleet_result.host_result([run_event(stdout)], fp.RUN_TASK, "audit")
    assert r["status"] == "failed" and "nested too deeply" in r["error"], r["error"]
    assert r["doc"] is None and r["settings"] == []

    def deeper(n):      # what a renderer 60 frames down would have met, had the document passed
        return deeper(n - 1) if n else json.dumps(deep)
    with pytest.raises(RecursionError):
        deeper(60)


def test_a_host_answering_json_null_is_not_called_too_deep():
    from test_adversarial_fleet import run_event
    from proxytune.tune import fleet_play as fp, fleet_result
    r = fleet_result.host_result([run_event("null")], fp.RUN_TASK, "audit")
    assert r["status"] == "failed" and "does not fit the schema" in r["error"], r["error"]


# ------------------------------------------- exports: a payload in the profile's own file name

@pytest.mark.parametrize("name", ["{{ lookup('pipe','id') }} proxytune-service-var.toml",
                                  "{% if lookup('pipe','id') %}{% endif %} proxytune-user-var.toml"])
def test_a_profile_file_name_that_would_be_templated_is_refused(tmp_path, sandbox, name):
    """The reference goes into the playbook's play name. Alone it is tagged !unsafe, but with the
    detected-service stand-in in it too, the scalar was untagged to take `{{ proxytune_service }}`:
    the lookup became live Jinja in the play name. A reference with evaluable text is refused."""
    from test_adversarial_profiles import GOOD, run
    prof = tmp_path / name
    prof.write_text(GOOD.format(what="d", include=""))
    r = run("tune", "export", "--format", "ansible", "-p", f"./{name}", cwd=tmp_path)
    assert r.returncode == 2, r.stdout
    assert "lookup" not in r.stdout and "would evaluate" in r.stderr and len(r.stderr.splitlines()) <= 2


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
    from conftest import REPO
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", str(REPO / ".venv/bin/python"), "-c",
                        RECYCLE, str(REPO / "tests"), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert "ROOT-SECRET" not in r.stdout
    assert r.returncode == 0, r.stderr
    assert "READ:''" in r.stdout and "WHY:pid" in r.stdout and "has exited" in r.stdout


# ------------------------------------------- terminal escapes in error lines

@needs_root
def test_a_launcher_link_named_with_escapes_reaches_no_terminal(nobody_dir):
    """PROXYTUNE_PROG (kept by `sudo -E`) names a link to this checkout's launcher whose name holds
    ESC ] 0 ; ... BEL: it is believed (it resolves to the launcher) and quoted into the needs-root hint
    of a permission-denied error, which was printed raw: the terminal's title was rewritten."""
    from conftest import REPO
    link = nobody_dir / "pt-\x1b]0;pwned\x07"
    link.symlink_to(REPO / "proxytune")
    env = {**os.environ, "PROXYTUNE_PROG": str(link), "HOME": str(nobody_dir / "none"),
           "XDG_CONFIG_HOME": "/root/.config"}      # a directory nobody may list: PermissionError
    r = subprocess.run([*AS_NOBODY, str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "tune", "plan",
                        "-p", "linux/proxy"], capture_output=True, text=True, env=env, timeout=60)
    assert "may not use it" in r.stderr, r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr
    assert "\\x1b]0;pwned\\x07" in r.stderr


@pytest.mark.parametrize("kind", ["error", "internal error"])
def test_every_error_line_is_one_inert_line(capsys, kind):
    """Whatever reaches say_error (an internal error's exception text quotes hostile input verbatim)."""
    from proxytune.cli import say_error
    say_error("bad \x1b[2J\rname\u202e", "run \x1b]0;t\x07 again", kind=kind)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err and "\u202e" not in err
    assert len(err.splitlines()) == 2


def test_a_catalog_file_named_with_escapes_is_warned_about_inertly(sandbox, cli):
    """A site profile whose file name holds ESC ] 0 ; ... BEL (unpacked from someone's tarball) is
    skipped; the warning saying so printed the name raw (its own sink, not say_error's)."""
    d = sandbox.root / "etc/proxytune/profiles"
    d.mkdir(parents=True)
    (d / "a\x1b]0;pwned\x07b.toml").write_text('[profile]\ndescription = "d"\nos = "linux"\n')
    r = cli("profiles", "list")
    assert "skipped" in r.output and "\\x1b]0;pwned\\x07" in r.output
    assert "\x1b]0;" not in r.output and "\x07" not in r.output


@needs_root
@pytest.mark.parametrize("owner", ["nobody", "root"])
def test_a_log_socket_another_user_owns_never_gets_roots_record(sandbox, prof, tmp_path, monkeypatch, owner):
    """PROXYTUNE_SYSLOG_SOCKET kept by `sudo -E` naming a user's socket: root's apply record (who,
    profile, journal id) is not sent to that user; root's own socket still gets it."""
    import pwd
    from test_adversarial_apply import LogSocket, apply_argv, rollback, run
    path = tmp_path / "log.sock"
    sock = LogSocket(path)
    if owner == "nobody":
        os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
    monkeypatch.setenv("PROXYTUNE_SYSLOG_SOCKET", str(path))
    monkeypatch.setenv("PROXYTUNE_JOURNAL_SOCKET", str(tmp_path / "no-journald"))
    assert run(apply_argv(prof)).returncode == 0
    assert rollback().returncode == 0
    assert len(sock.messages()) == (0 if owner == "nobody" else 2)

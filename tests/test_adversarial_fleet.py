"""The fleet as an attacker sees it (issue 20, classes 6 and 7 and the fleet
part of 4): a host that answers garbage, hangs, or had a directory planted in
its state dir; a --limit that is an ssh option; a checkout with untracked
junk and symlinks; a controller killed mid-run. Hosts are network namespaces
reached over real ssh (tests/fleet_hosts.py); a hostile host is one whose
`proxytune_python` is a wrapper script that lies or hangs.
"""

import base64
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from conftest import REPO, needs_root
from fleet_hosts import namespace_hosts
from proxytune.reports import schema
from proxytune.tune import fleet_play as fp, fleet_result, fleet_state, fleet_unpack

needs_ansible = pytest.mark.skipif(
    not (shutil.which("ansible-playbook") and os.path.exists("/usr/sbin/sshd")),
    reason="needs ansible-playbook and openssh-server (make test installs them as root)")

PROFILE = """
[profile]
description = "adversarial fleet test: one namespaced sysctl"
os = "linux"

[sysctl."net.core.somaxconn"]
at_least = 8192
reason = "listen backlog"
source = "test"
"""
# what a lying or hanging host runs instead of python3 (only for proxytune's own commands)
LIAR = """#!/bin/sh
case " $* " in
  *" tune apply "*) /usr/bin/python3 "$@" >/dev/null; echo '{LIE}'; exit 0 ;;
  *" tune check "*) echo '{LIE}'; exit 0 ;;
esac
exec /usr/bin/python3 "$@"
"""
HANGER = """#!/bin/sh
case " $* " in
  {WHEN}) touch {MARK}; exec sleep {SECONDS} ;;
esac
exec /usr/bin/python3 "$@"
"""


# ---------------------------------------------------------------- class 6, without hosts: every document is checked

SETTING = {"setting": "sysctl:net.core.somaxconn", "current": 4096, "wanted": 8192, "mode": "at_least",
           "status": "drift", "reason": "r", "source": "s", "current_text": "4096", "wanted_text": ">= 8192"}
AUDIT = {"profile": "p", "settings": [SETTING], "summary": {"met": 0, "drift": 1, "n/a": 0, "error": 0}}


def envelope(kind, data):
    doc = schema.envelope("audit", AUDIT)
    return json.dumps({**doc, "kind": kind, "data": data})


def run_event(stdout, event="ok", rc=0, task=fp.RUN_TASK):
    return {"event": event, "host": "h1", "task": task, "rc": rc, "stdout": stdout}


APPLY = {"journal": None, "steps": [], "files_only": False, "notes": [], "verify": AUDIT}   # schema-valid
ROLLBACK = {"journal": "x", "state": "rolled-back", "steps": [], "kept": [], "notes": [], "failures": []}


@pytest.mark.parametrize("kind,stdout,why", [
    ("apply", envelope("apply", []), "does not fit the schema at data"),               # data is a list: crashed
    ("apply", "{}", "does not fit the schema"),                                         # {} counted as ok
    ("audit", "{}", "does not fit the schema"),
    ("audit", "Traceback (most recent call last):", "not a JSON document"),
    ("audit", "[1, 2]", "does not fit the schema"),
    ("apply", envelope("audit", AUDIT), "its audit result where its apply result was due"),
    ("apply", envelope("apply", {**APPLY, "journal": 7}), "data/journal"),
    ("apply", envelope("apply", {**APPLY, "journal": "../../x y"}), "data/journal"),
    ("apply", envelope("apply", {**APPLY, "journal": "-oProxyCommand=x"}), "data/journal"),
    ("apply", envelope("apply", {**APPLY, "verify": {"settings": ["x"], "summary": {}}}), "data/verify"),
    ("audit", envelope("audit", {**AUDIT, "summary": {"met": "many", "drift": 0, "n/a": 0, "error": 0}}),
     "data/summary/met"),
    ("rollback", envelope("rollback", {**ROLLBACK, "steps": {}}), "data/steps"),
    ("caps", envelope("probe", {"probe": "caps", "capabilities": {"root": {"ok": "yes"}}, "scripts": {}}),
     "data/capabilities/root"),
])
def test_a_malformed_answer_is_a_failed_host_never_a_crash_nor_ok(kind, stdout, why):
    task = fp.ROLLBACK_TASK if kind == "rollback" else fp.RUN_TASK
    r = fleet_result.host_result([run_event(stdout, task=task)], task, kind)
    assert r["status"] == "failed", r
    assert why in r["error"], r["error"]
    assert r["doc"] is None and r["settings"] == []


def test_a_well_formed_answer_is_ok_and_a_timed_out_one_says_so():
    r = fleet_result.host_result([run_event(envelope("audit", AUDIT))], fp.RUN_TASK, "audit")
    assert r["status"] == "ok" and r["settings"][0]["current_text"] == "4096"
    r = fleet_result.host_result([run_event("", event="failed", rc=124)], fp.RUN_TASK, "audit")
    assert r["status"] == "failed" and "--timeout" in r["error"]


def test_host_text_reaches_no_terminal_as_control_characters():
    ev = run_event("", event="failed", rc=1)
    ev["stderr"] = "boom \x1b]0;owned\x07\x1b[2J done"
    r = fleet_result.host_result([ev], fp.RUN_TASK, "audit")
    assert "\x1b" not in r["error"] and "\x07" not in r["error"]


# ---------------------------------------------------------------- run records: a sequence, private dirs

def test_runs_are_ordered_by_a_sequence_not_the_clock(tmp_path, monkeypatch):
    state = tmp_path / "state"
    first = fleet_state.new_run(state, "p", "inv", ["a"], "p")
    monkeypatch.setattr(time, "gmtime", lambda *a: time.struct_time((2001, 1, 1, 0, 0, 0, 0, 1, 0)))
    second = fleet_state.new_run(state, "p", "inv", ["a"], "p")        # the clock went back 25 years
    for run in (first, second):
        run["hosts"]["a"] = {"journal": f"j{run['seq']}", "status": "ok"}
        fleet_state.save(state, run)
    assert (first["seq"], second["seq"]) == (1, 2)
    assert fleet_state.last_open(state)["id"] == second["id"]
    for d in (state, state / "fleet", state / "fleet" / "runs"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


def test_a_started_host_without_an_answer_stays_on_record(tmp_path):
    state = tmp_path / "state"
    run = fleet_state.new_run(state, "p", "inv", ["a"], "/b/fleet-profile.toml")
    run["hosts"]["a"] = {"journal": None, "status": "started", "mark": 3}
    fleet_state.save(state, run)
    assert fleet_state.last_open(state)["hosts"]["a"]["mark"] == 3
    history = json.dumps([{"id": "old", "seq": 3, "state": "applied", "profile": "/b/fleet-profile.toml"},
                          {"id": "ours", "seq": 4, "state": "applied", "profile": "/b/fleet-profile.toml"},
                          {"id": "other", "seq": 5, "state": "applied", "profile": "linux/proxy"}])
    assert fleet_state.open_after(history, 3, "/b/fleet-profile.toml") == ["ours"]
    assert fleet_state.open_after('{"data": 1}', 3, "x") is None
    for hostile in ("-oProxyCommand=x", "{{ lookup('pipe', 'id') }}", "a b"):        # would reach `--id ID`
        row = [{"id": hostile, "seq": 9, "state": "applied", "profile": "/b/fleet-profile.toml"}]
        assert fleet_state.open_after(json.dumps(row), 3, "/b/fleet-profile.toml") is None


# ---------------------------------------------------------------- --limit and names that are options

@pytest.mark.parametrize("limit", ["-oProxyCommand=touch /tmp/pt-fleet-owned", "-oProxyCommand", "--list-hosts"])
def test_a_limit_that_is_an_option_is_refused(tmp_path, limit):
    inv = tmp_path / "inv.ini"
    inv.write_text("px ansible_connection=local\n")
    r = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "fleet", "check", "-i", str(inv),
                        f"--limit={limit}"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PROXYTUNE_STATE_DIR": str(tmp_path / "state")})
    assert r.returncode == 2 and r.stderr.startswith("proxytune: error: --limit"), r.stderr
    assert not os.path.exists("/tmp/pt-fleet-owned")


# ---------------------------------------------------------------- the bundle: tracked, packaged, no symlink

def make_tree(root: Path, git: bool) -> Path:
    for rel, text in {"cli.py": "", "core/__init__.py": "", "core/a.py": "", "tune/__init__.py": "", "tune/b.py": "",
                      "newlayer/__init__.py": "", "newlayer/c.py": "", "notes/n.py": "",
                      "profiles/linux/x.toml": "", "profiles/linux/NOTES.txt": "", "probes/p.bt": "",
                      "microbench/evbench/main.c": ""}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    if git:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    (root / "tune/junk.py").write_text("import os; os.system('id')\n")          # untracked
    (root / "tune/shadow.py").symlink_to("/etc/shadow")
    (root / "core/linked").symlink_to("/etc")
    (root / "reports").symlink_to("/etc")                 # a whole top directory as a link
    return root


@pytest.mark.parametrize("git", [True, False])
def test_the_bundle_ships_only_packaged_files_and_follows_no_symlink(tmp_path, git):
    tree = make_tree(tmp_path / "tree", git)
    names = {str(rel) for _, rel in fp.shipped_files(tree, tree)}
    # newlayer/ is a package no list names (its __init__.py makes it one): shipped; notes/ is not one
    expected = {"cli.py", "core/__init__.py", "core/a.py", "tune/__init__.py", "tune/b.py", "newlayer/__init__.py",
                "newlayer/c.py", "profiles/linux/x.toml", "probes/p.bt", "microbench/evbench/main.c"}
    assert names == (expected if git else expected | {"tune/junk.py"}), names


def test_the_bundle_from_a_debian_tree_takes_its_data_from_the_share_dir(tmp_path):
    code, data = tmp_path / "dist-packages/proxytune", tmp_path / "share/proxytune"
    for rel in ("cli.py", "tune/__init__.py", "tune/b.py", "probes/__init__.py", "probes/p.py"):
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        (code / rel).write_text("")
    for rel in ("profiles/linux/proxy.toml", "probes/p.bt", "microbench/lua/m.lua"):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text("")
    tarball, sha = fp.bundle(tmp_path, None, code, data)
    names = set(tarfile.open(tarball).getnames())
    assert names == {"cli.py", "tune/__init__.py", "tune/b.py", "probes/__init__.py", "probes/p.py",
                     "profiles/linux/proxy.toml", "probes/p.bt", "microbench/lua/m.lua"}


# ---------------------------------------------------------------- the unpacker on the host (run here, as root)

def module_args(state: Path, tarball: Path, sha: str, argv=("--version",)) -> dict:
    """What the play passes the module (fleet_play.run_task), for a host whose state dir is `state`."""
    return {"state_dir": str(state), "bundle": f"{sha[:16]}-0123456789ab", "sha256": sha,
            "payload": base64.b64encode(tarball.read_bytes()).decode(), "python": "/usr/bin/python3",
            "argv": list(argv), "timeout": 60, "ok": [0], "deps": "no-install"}


@pytest.fixture
def shipped(tmp_path):
    """A state dir and the module's arguments for a real bundle (with a profile file in it)."""
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)                   # read-only for others is mended to 0700, writable is refused
    (tmp_path / "p.toml").write_text(PROFILE)
    tarball, sha = fp.bundle(tmp_path, tmp_path / "p.toml")
    return {"state": state, "sha": sha, "tarball": tarball, "args": module_args(state, tarball, sha)}


@needs_root
def test_the_unpacker_unpacks_fresh_runs_there_and_leaves_only_the_verified_code(shipped):
    out = fleet_unpack.serve(shipped["args"])
    assert out.get("failed") is not True and out["rc"] == 0 and out["stdout"].startswith("proxytune"), out
    fleet = shipped["state"] / "fleet"
    assert [p.name for p in fleet.iterdir()] == [f"code-{shipped['sha']}"]         # this run's own dir is gone
    code = fleet / f"code-{shipped['sha']}"
    assert (code / "cli.py").is_file()
    for d in (code, fleet, shipped["state"]):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


@needs_root
def test_a_verified_unpack_is_reused_and_a_run_gets_its_profile_under_a_fresh_name(shipped, monkeypatch):
    run_dir = shipped["state"] / "fleet" / f"bundle-{shipped['args']['bundle']}"
    args = {**shipped["args"], "argv": ["tune", "check", "--json", "-p", f"{run_dir}/fleet-profile.toml"],
            "ok": [0, 1, 2]}
    monkeypatch.setenv("PROXYTUNE_STATE_DIR", str(shipped["state"]))
    monkeypatch.setenv("PROXYTUNE_ROOT", str(shipped["state"].parent))
    first = fleet_unpack.serve(args)
    code = shipped["state"] / "fleet" / f"code-{shipped['sha']}"
    inode = code.stat().st_ino
    second = fleet_unpack.serve(args)
    for out in (first, second):
        assert out.get("failed") is not True and json.loads(out["stdout"])["kind"] == "audit", out
    assert code.stat().st_ino == inode                                          # reused, not unpacked again
    assert not run_dir.exists()


@needs_root
@pytest.mark.parametrize("tamper", ["a file changed", "a file added", "a symlink", "group-writable",
                                    "owned by nobody", "mode 0755", "a file where the directory goes"])
def test_an_unpack_that_no_longer_matches_its_digest_is_never_run(shipped, tamper, tmp_path):
    """The reused directory is checked every time; what fails the check is replaced, never run."""
    assert fleet_unpack.serve(shipped["args"])["rc"] == 0
    code = shipped["state"] / "fleet" / f"code-{shipped['sha']}"
    marker = tmp_path / "planted-ran"
    planted = f"open({str(marker)!r}, 'w').write('ran as root')\n"
    if tamper == "a file changed":
        (code / "cli.py").write_text(planted)
    elif tamper == "a file added":
        (code / "tune" / "sitecustomize.py").write_text(planted)
    elif tamper == "a symlink":
        (code / "cli.py").unlink()
        (tmp_path / "elsewhere.py").write_text(planted)
        (code / "cli.py").symlink_to(tmp_path / "elsewhere.py")
    elif tamper == "group-writable":
        (code / "tune").chmod(0o775)
    elif tamper == "owned by nobody":
        os.chown(code / "tune" / "fleet.py", pwd.getpwnam("nobody").pw_uid, -1)
    elif tamper == "mode 0755":
        code.chmod(0o755)
    else:
        shutil.rmtree(code)
        code.write_text(planted)
    out = fleet_unpack.serve(shipped["args"])
    assert out["rc"] == 0 and out["stdout"].startswith("proxytune"), out
    assert not marker.exists()
    assert fleet_unpack.matches(str(code), fleet_unpack.files_of(shipped["tarball"].read_bytes()))


@needs_root
@pytest.mark.parametrize("attack", ["fleet dir 0777", "fleet dir owned by nobody", "state dir 0777",
                                    "parent 0777", "state dir is a symlink", "digest mismatch",
                                    "bundle name taken", "fleet dir is a symlink"])
def test_the_unpacker_refuses_what_others_could_have_touched(shipped, attack):
    state, nobody, args = shipped["state"], pwd.getpwnam("nobody").pw_uid, shipped["args"]
    fleet = state / "fleet"
    if attack.startswith("fleet dir"):
        fleet.mkdir(mode=0o700)
        fleet.chmod(0o777) if "0777" in attack else os.chown(fleet, nobody, -1)
    elif attack == "state dir 0777":
        state.chmod(0o777)
    elif attack == "parent 0777":
        state.parent.chmod(0o777)
    elif attack == "state dir is a symlink":
        state.rmdir()
        (state.parent / "elsewhere").mkdir(mode=0o700)
        state.symlink_to(state.parent / "elsewhere")
    elif attack == "digest mismatch":
        args = {**args, "payload": base64.b64encode(shipped["tarball"].read_bytes() + b"\0").decode()}
    elif attack == "fleet dir is a symlink":
        (state.parent / "elsewhere").mkdir(mode=0o700)
        fleet.symlink_to(state.parent / "elsewhere")
    elif attack == "bundle name taken":
        planted = fleet / f"bundle-{args['bundle']}"
        planted.mkdir(parents=True, mode=0o700)
        (planted / "fleet-profile.toml").write_text("planted\n")
    try:
        out = fleet_unpack.serve(args)
    finally:
        state.parent.chmod(0o700)
    assert out["failed"] is True and out["stderr"].startswith("proxytune bundle refused:"), out
    if attack == "bundle name taken":
        assert (fleet / f"bundle-{args['bundle']}" / "fleet-profile.toml").read_text() == "planted\n"   # kept


@needs_root
@pytest.mark.parametrize("member", ["../escape.py", "link", "hardlink", "/abs.py", "fifo"])
def test_the_unpacker_refuses_a_bundle_with_an_escaping_member(shipped, member):
    import hashlib
    import io
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo(member)
        if member == "link":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc"
        elif member == "hardlink":
            info.type, info.linkname = tarfile.LNKTYPE, "/etc/shadow"
        elif member == "fifo":
            info.type = tarfile.FIFOTYPE
        tar.addfile(info, io.BytesIO(b""))
    sha = hashlib.sha256(raw.getvalue()).hexdigest()
    args = {**shipped["args"], "sha256": sha, "bundle": f"{sha[:16]}-0123456789ab",
            "payload": base64.b64encode(raw.getvalue()).decode()}
    out = fleet_unpack.serve(args)
    assert out["failed"] is True and out["stderr"].startswith("proxytune bundle refused:"), out
    assert not (shipped["state"].parent / "escape.py").exists()


def test_any_argument_survives_ansibles_jsonargs_substitution():
    """Ansible writes the module's arguments into its source as JSON (module_common.py, jsonargs):
    quotes, backslashes and triple quotes in a host's variables arrive intact, ending no string."""
    hostile = "/tmp/a'''b\"\"\"c\\d\\"
    args = {"state_dir": hostile, "bundle": "0" * 16 + "-0123456789ab", "sha256": "1" * 64, "payload": "",
            "python": "/usr/bin/python3", "argv": ['x"""y', "\\", "'''"], "timeout": 1, "ok": [0], "deps": "install"}
    source = fp.UNPACKER.read_text().replace("<<INCLUDE_ANSIBLE_MODULE_JSON_ARGS>>", json.dumps(args))
    probe = source.replace('\nif __name__ == "__main__":\n', "\nif False:\n") + "\nprint(json.dumps(json.loads(ARGS)))\n"
    r = subprocess.run([sys.executable, "-"], input=probe, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == args


# ---------------------------------------------------------------- over real hosts

HOSTS = {"pva": {}, "pvb": {}}


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    d = tmp_path_factory.mktemp("advfleet")
    (d / "one.toml").write_text(PROFILE)
    with namespace_hosts(d, HOSTS) as fh:
        yield fh


def host_inventory(fh, name: str, **host_vars) -> Path:
    """hosts.ini with extra variables on one host (a hostile python, another state dir)."""
    d = fh["dir"]
    text = (d / "hosts.ini").read_text()
    for key, value in host_vars.items():
        if key == "proxytune_state_dir":
            text = text.replace(f"proxytune_state_dir={d / name / 'state'}", f"proxytune_state_dir={value}")
        else:
            text = text.replace(f"\n{name} ", f"\n{name} {key}={value} ")
    inv = d / f"inv-{os.getpid()}-{time.monotonic_ns()}.ini"
    inv.write_text(text)
    return inv


def script(fh, name: str, text: str) -> Path:
    path = fh["dir"] / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def fleet(fh, *args, timeout=300, env=None):
    d = fh["dir"]
    full = {**os.environ, "PROXYTUNE_STATE_DIR": str(d / "controller-state"), "ANSIBLE_HOME": str(d / "ansible-home"),
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(d / "cp"), "ANSIBLE_TIMEOUT": "60", **(env or {})}
    argv = [str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "fleet", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=full, timeout=timeout)


def somaxconn(fh, host):
    return subprocess.run(["ip", "netns", "exec", fh["ns"][host], "sysctl", "-n", "net.core.somaxconn"],
                          check=True, capture_output=True, text=True).stdout.strip()


@needs_root
@needs_ansible
@pytest.mark.parametrize("lie", ["{}", '{"schema": "proxytune.result/1", "kind": "audit", "data": []}'])
def test_a_host_answering_garbage_to_check_is_failed_not_ok(hosts, lie):
    liar = script(hosts, "liar-check.sh", LIAR.replace("{LIE}", lie))
    inv = host_inventory(hosts, "pva", proxytune_python=liar)
    r = fleet(hosts, "check", "-i", str(inv), "-p", str(hosts["dir"] / "one.toml"), "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    data = json.loads(r.stdout)["data"]
    assert data["hosts"]["pva"]["status"] == "failed" and "schema" in data["hosts"]["pva"]["error"]
    assert data["hosts"]["pvb"]["status"] == "ok", data["hosts"]["pvb"].get("error")


@needs_root
@needs_ansible
@pytest.mark.parametrize("lie", ['{"schema": "proxytune.result/1", "kind": "apply", "data": []}', "not json"])
def test_a_host_that_changed_and_answered_garbage_is_rolled_back_and_the_others_stay_undoable(hosts, lie):
    """pva really applies, then answers garbage: the apply does not crash, pva is failed and
    rolled back through its start record; pvb's change is on record for `fleet rollback`."""
    liar = script(hosts, "liar-apply.sh", LIAR.replace("{LIE}", lie))
    inv = host_inventory(hosts, "pva", proxytune_python=liar)
    assert somaxconn(hosts, "pva") == somaxconn(hosts, "pvb") == "4096"
    r = fleet(hosts, "apply", "-i", str(inv), "-p", str(hosts["dir"] / "one.toml"), "--yes", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    data = json.loads(r.stdout)["data"]
    assert data["hosts"]["pva"]["status"] == "failed", data["hosts"]["pva"]
    runs = [f.read_text() for f in (hosts["dir"] / "controller-state/fleet/runs").glob("*.json")]
    assert data["hosts"]["pva"].get("rolled_back") is True, (r.stderr, runs)
    assert somaxconn(hosts, "pva") == "4096"
    if data["hosts"]["pvb"]["status"] == "ok":
        assert somaxconn(hosts, "pvb") == "8192"
    r = fleet(hosts, "rollback", "-i", str(inv), "-p", str(hosts["dir"] / "one.toml"), "--yes", "--json")
    assert r.returncode in (0, 2), r.stderr
    if "nothing to roll back" not in r.stderr:
        assert json.loads(r.stdout)["data"]["state"] == "rolled-back", r.stdout
    assert somaxconn(hosts, "pva") == somaxconn(hosts, "pvb") == "4096"


@needs_root
@needs_ansible
@pytest.mark.parametrize("when", ['*" tune check "*', '*/fleet_unpack.py" "*'])
def test_a_hung_host_is_failed_after_the_timeout_and_the_others_finish(hosts, when):
    mark = hosts["dir"] / f"hung-{'check' if 'check' in when else 'unpack'}"
    hanger = script(hosts, f"hang-{mark.name}.sh", HANGER.replace("{WHEN}", when).replace("{MARK}", str(mark))
                    .replace("{SECONDS}", "617"))
    inv = host_inventory(hosts, "pva", proxytune_python=hanger)
    started = time.monotonic()
    r = fleet(hosts, "check", "-i", str(inv), "-p", str(hosts["dir"] / "one.toml"), "--timeout", "10", "--json")
    took = time.monotonic() - started
    assert mark.exists(), "the host did hang"
    assert r.returncode == 2, r.stderr
    data = json.loads(r.stdout)["data"]
    assert data["hosts"]["pva"]["status"] == "failed" and "timeout" in data["hosts"]["pva"]["error"].lower()
    assert data["hosts"]["pvb"]["status"] == "ok"
    assert took < 200, took
    deadline = time.monotonic() + 30         # stopped on the host, not only given up on
    while time.monotonic() < deadline and subprocess.run(["pgrep", "-f", "sleep 617"]).returncode == 0:
        time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", "sleep 617"]).returncode == 1


@needs_root
@needs_ansible
@pytest.mark.parametrize("attack", ["planted bundle", "fleet dir 0777", "state dir owned by nobody"])
def test_a_planted_or_open_state_dir_is_never_run_from(hosts, attack):
    d = hosts["dir"]
    state = d / f"pva-{attack.replace(' ', '-')}"
    state.mkdir(mode=0o700)
    marker = d / f"planted-ran-{os.getpid()}"
    planted = f"open({str(marker)!r}, 'w').write('ran as root')\n"
    sha = fp.bundle(d)[1]
    if attack == "planted bundle":       # where earlier versions unpacked, and where this one would by name
        for name in (f"bundle-{sha[:16]}", f"bundle-{sha[:16]}-000000000000"):
            (state / "fleet" / name).mkdir(parents=True)
            (state / "fleet" / name / "cli.py").write_text(planted)
            os.chown(state / "fleet" / name, pwd.getpwnam("nobody").pw_uid, -1)
        (state / "fleet").chmod(0o700)
    elif attack == "fleet dir 0777":
        (state / "fleet").mkdir()
        (state / "fleet").chmod(0o777)
    else:
        os.chown(state, pwd.getpwnam("nobody").pw_uid, -1)
    inv = host_inventory(hosts, "pva", proxytune_state_dir=state)
    r = fleet(hosts, "check", "-i", str(inv), "-p", str(d / "one.toml"), "--json")
    assert not marker.exists(), "a planted cli.py ran"
    data = json.loads(r.stdout)["data"]
    if attack == "planted bundle":
        assert r.returncode == 1 and data["hosts"]["pva"]["status"] == "ok", r.stderr
    else:
        assert r.returncode == 2 and data["hosts"]["pva"]["status"] == "failed"
        assert "proxytune bundle refused" in data["hosts"]["pva"]["error"], data["hosts"]["pva"]["error"]


@needs_root
@needs_ansible
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_controller_killed_mid_run_leaves_no_temp_dir(hosts, tmp_path, sig):
    mark = tmp_path / "hanging"
    hanger = script(hosts, f"hang-{sig.name}.sh", HANGER.replace("{WHEN}", '*" tune check "*').replace("{MARK}", str(mark))
                    .replace("{SECONDS}", "619"))
    inv = host_inventory(hosts, "pva", proxytune_python=hanger)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    d = hosts["dir"]
    env = {**os.environ, "TMPDIR": str(tmp), "PROXYTUNE_STATE_DIR": str(d / "controller-state"),
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(d / "cp"), "ANSIBLE_TIMEOUT": "60"}
    p = subprocess.Popen([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "fleet", "check", "-i", str(inv),
                          "-p", str(d / "one.toml"), "--limit", "pva", "--timeout", "10"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not mark.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.2)
    assert mark.exists() and list(tmp.glob("proxytune-fleet-*")), "the run was under way"
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "Traceback" not in err, err
    assert not list(tmp.glob("proxytune-fleet-*")), list(tmp.iterdir())
    deadline = time.monotonic() + 45         # what the host was running ends within --timeout too
    while time.monotonic() < deadline and subprocess.run(["pgrep", "-f", "sleep 619"]).returncode == 0:
        time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", "sleep 619"]).returncode == 1



# ---------------------------------------------------------------- class 7: the fleet from the .deb and the wheel

@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """make dist's .deb unpacked into a temp root, and its wheel in a fresh venv (Debian's python3-* inside)."""
    if subprocess.run(["/usr/bin/python3", "-c", "import click, rich, jsonschema, matplotlib"]).returncode:
        pytest.skip("needs python3-click python3-rich python3-jsonschema python3-matplotlib (make deps)")
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([str(REPO / "packaging/dist.sh"), str(out)], cwd=REPO, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHON": str(REPO / ".venv/bin/python")})
    assert r.returncode == 0, r.stderr
    deb, = out.glob("proxytune_*_all.deb")
    wheel, = out.glob("proxytune-*-py3-none-any.whl")
    root = tmp_path_factory.mktemp("debroot")
    assert subprocess.run(["dpkg-deb", "-x", str(deb), str(root)]).returncode == 0
    venv = tmp_path_factory.mktemp("venv") / "v"
    assert subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)]).returncode == 0
    r = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-index",
                        "--disable-pip-version-check", str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return {"deb": root, "venv": venv}


def installed_argv(installed, how):
    if how == "deb":
        return ["/usr/bin/python3", str(installed["deb"] / "usr/bin/proxytune")], \
            {"PYTHONPATH": str(installed["deb"] / "usr/lib/python3/dist-packages")}
    return [str(installed["venv"] / "bin/proxytune")], {"PYTHONPATH": ""}


@needs_root
@needs_ansible
@pytest.mark.parametrize("how", ["deb", "wheel"])
def test_the_installed_fleet_bundles_its_profiles_and_scripts_and_checks_a_host(hosts, installed, how, tmp_path):
    argv, env = installed_argv(installed, how)
    env = {**os.environ, **env, "PYTHONDONTWRITEBYTECODE": "1"}
    code = ("import sys, tarfile; from proxytune.tune import fleet_play as fp; "
            "print('\\n'.join(tarfile.open(fp.bundle(__import__('pathlib').Path(sys.argv[1]))[0]).getnames()))")
    py = argv[0] if how == "deb" else str(installed["venv"] / "bin/python")
    r = subprocess.run([py, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    names = set(r.stdout.split())
    assert {"cli.py", "profiles/linux/proxy.toml", "probes/pollscan.bt", "tune/fleet_unpack.py"} <= names
    d = hosts["dir"]
    r = subprocess.run([*argv, "fleet", "check", "-i", str(d / "hosts.ini"), "-p", "linux/proxy",
                        "--only", "sysctl:net.core.somaxconn", "--limit", "pvb", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**env, "PROXYTUNE_STATE_DIR": str(tmp_path / "state"),
                            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(d / "cp"), "ANSIBLE_TIMEOUT": "60"})
    assert r.returncode in (0, 1), r.stdout + r.stderr
    host = json.loads(r.stdout)["data"]["hosts"]["pvb"]
    assert host["status"] == "ok"
    assert [(s["setting"], s["current_text"]) for s in host["settings"]] == [("sysctl:net.core.somaxconn",
                                                                             somaxconn(hosts, "pvb"))]


# ---------------------------------------------------------------- issue 19 item 10: a host without proxytune's modules

@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A python3 without click, rich and jsonschema: what a fresh Debian host has (the namespace
    hosts share this machine's files, so nothing is uninstalled: the host's python points here)."""
    venv = tmp_path_factory.mktemp("bare") / "v"
    r = subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert subprocess.run([str(venv / "bin/python3"), "-c", "import click"], capture_output=True).returncode == 1
    return venv / "bin/python3"


@needs_root
@needs_ansible
@pytest.mark.parametrize("command,install", [("check", False), ("check", True), ("doctor", False)])
def test_a_host_without_the_debian_dependencies_is_one_line_naming_them(hosts, bare_python, command, install):
    inv = host_inventory(hosts, "pva", proxytune_python=bare_python)
    r = fleet(hosts, command, "-i", str(inv), "-p", str(hosts["dir"] / "one.toml"), "--json",
              *([] if install else ["--no-install"]))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    data = json.loads(r.stdout)["data"]
    error = data["hosts"]["pva"]["error"]
    assert data["hosts"]["pva"]["status"] == "failed"
    assert "python3-click python3-rich python3-jsonschema" in error and "ModuleNotFoundError" not in error, error
    assert ("still missing after apt" if install else "--no-install") in error
    assert data["hosts"]["pvb"]["status"] == "ok", data["hosts"]["pvb"].get("error")
    assert r.stderr.count("python3-click") == 1, r.stderr        # one line for the host


# ---------------------------------------------------------------- host values in reports

def test_host_values_reach_no_report_as_controls_or_markup(tmp_path):
    from proxytune.reports import fleet as fleet_report
    evil = "6.1\x1b]8;;http://x\x07click\x1b]8;;\x07 <img src=x onerror=alert(1)> | \x1b[2J"
    host = {"status": "failed", "fingerprint": {"kernel": evil}, "settings": [dict(SETTING, current_text=evil)],
            "summary": {}, "error": evil}
    data = {"fleet": "check", "profile": "p\x1b[31m", "hosts": {"pva": host}, "summary": {
        "ok": 0, "unreachable": 0, "failed": 1, "skipped": 0}, "exit": 2}
    for t in fleet_report.tables(data):
        cells = [t.title, *t.headers, *(str(c) for row in t.rows for c in row)]
        assert not any("\x1b" in c or "\x07" in c for c in cells), cells
    md, html = fleet_report.write({"data": data}, tmp_path / "out")
    assert "\x1b" not in md.read_text() and "<img" not in md.read_text()
    assert "\x1b" not in html.read_text() and "<img" not in html.read_text()


@pytest.mark.parametrize("host", [{"summary": [1]}, {"settings": [{"setting": "s", "status": "met"}]},
                                  {"capabilities": ["root"]}, {"error": {"x": 1}}])
def test_a_fleet_result_file_that_would_crash_the_report_is_refused(tmp_path, host):
    doc = schema.envelope("fleet", {"fleet": "check", "profile": "p", "summary": {}, "exit": 0,
                                    "hosts": {"pva": {"status": "ok", "fingerprint": None, "settings": []}}})
    doc["data"]["hosts"]["pva"].update(host)
    (tmp_path / "f.json").write_text(json.dumps(doc))
    r = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "report", "fleet", str(tmp_path / "f.json"),
                        "-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("proxytune: error:") and "internal error" not in r.stderr, r.stderr


# ------------------------------------------- fleet: hostile JSON shapes that pass (or break) the parser

def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("where", ["whole", "current"])
@pytest.mark.host  # the host fingerprint runs systemd-detect-virt (the tier: tests/tiers.py)
def test_a_host_answer_nested_too_deeply_is_a_failed_host(where):
    """A host prints 100000 nested arrays (json.loads raised RecursionError: the fleet crashed), or a
    schema-valid audit whose setting's free-form `current` is 950 levels deep (it parses, but any later
    json.dumps or render of the host rows from a few frames deeper recurses past Python's limit)."""
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
    r = fleet_result.host_result([run_event("null")], fp.RUN_TASK, "audit")
    assert r["status"] == "failed" and "does not fit the schema" in r["error"], r["error"]

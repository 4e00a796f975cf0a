"""A local user cannot choose which process is "the proxy" (issue 27, item 1).

The threat: `nobody` starts its own program under a proxy's name (a copy of
sleep called squid, a process renamed with prctl, the real nginx binary run by
itself) and root's tune detection, `rlimit:*`, the exports, `doctor --comm` and
the monitoring formats took it for the proxy: nobody became the profile's
{user} in limits.d and the playbook, root's apply failed or prlimit'ed the fake,
and the fake's tiny fd limit paged on-call. Every attacker here runs as nobody
via setpriv; root's own proxy is a root-started master with a worker of a
system user, as nginx and squid run.
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

from conftest import NOBODY, needs_root, proxytune, wait_exec, wait_for

pytestmark = needs_root

PYTHON = Path(sys.executable).resolve()
# root's proxy: the master stays root, its worker drops to the proxy's system user (nginx, squid)
MASTER = """
import os, sys, time
child = os.fork()
if child == 0:
    os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))
    time.sleep(600)
    os._exit(0)
print("ready", child, flush=True)
time.sleep(600)
"""
RENAMED = "import ctypes, time; ctypes.CDLL(None).prctl(15, {name!r}.encode(), 0, 0, 0); print('ready', flush=True); time.sleep(600)"


def _stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


@pytest.fixture
def procs():
    """start(argv, comm, nofile=None): a process in its own session, killed (with its children) afterwards."""
    started = []

    def start(argv, comm, nofile=None, **kw):
        lim = ["prlimit", f"--nofile={nofile}"] if nofile else []
        p = subprocess.Popen([*lim, *argv], start_new_session=True, **kw)
        started.append(p)
        wait_exec(p, comm)
        return p
    yield start
    for p in started:
        _stop(p)


@pytest.fixture(scope="module")
def nobody_bin():
    """A directory nobody owns holding nobody's own copies of sleep named like proxies."""
    d = Path(tempfile.mkdtemp(prefix="pt-fakeproxy-", dir="/tmp"))
    try:
        for name in ("squid", "nginx"):
            shutil.copy("/bin/sleep", d / name)
            os.chown(d / name, 65534, 65534)
        os.chmod(d, 0o755)
        os.chown(d, 65534, 65534)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def root_bin():
    """A root-owned directory with root's copies of python named like proxies (the 'real' proxy)."""
    d = Path(tempfile.mkdtemp(prefix="pt-rootproxy-", dir="/tmp"))
    try:
        os.chmod(d, 0o755)
        for name in ("squid", "nginx"):
            shutil.copy(PYTHON, d / name)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def fake(procs, nobody_bin, name="squid", nofile="64:64"):
    """nobody's copy of sleep called `name`, with a small fd limit."""
    return procs([*NOBODY, str(nobody_bin / name), "600"], name, nofile=nofile)


def real(procs, root_bin, name="squid", user="proxy", nofile="2000:4096"):
    """root's `name`: a root master and a worker of `user`; (master pid, worker pid)."""
    import pwd
    uid = pwd.getpwnam(user).pw_uid
    p = procs([str(root_bin / name), "-c", MASTER, str(uid)], name, nofile=nofile, stdout=subprocess.PIPE, text=True)
    worker = int(p.stdout.readline().split()[1])
    assert wait_for(lambda: _uid(worker) == uid, 10)
    return p.pid, worker


def _uid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/status").read_text().split("\nUid:")[1].split()[0])
    except (OSError, IndexError):
        return -1


LIVE = {"PROXYTUNE_ROOT": "/"}


def check_json(*args, env=None):
    r = proxytune("tune", "check", "--json", *args, env={**LIVE, **(env or {})})
    assert r.returncode in (0, 1, 2) and r.stdout, r.stderr
    return r, json.loads(r.stdout)["data"]


# ---------------------------------------------------------------- tune's detection: service and {user}

@pytest.mark.parametrize("how", ["copy-of-sleep", "prctl-renamed"])
def test_a_users_process_named_like_the_proxy_is_not_the_detected_service_nor_its_user(sandbox, procs, nobody_bin,
                                                                                          how):
    """nobody's `squid` (a copy of sleep; or python renaming itself squid with prctl) is the only
    squid: root's default audit took service squid 'from a running process' and user nobody."""
    if how == "copy-of-sleep":
        p = fake(procs, nobody_bin)
    else:
        p = procs([*NOBODY, str(PYTHON), "-c", RENAMED.format(name="squid")], "squid", stdout=subprocess.PIPE)
    r, doc = check_json("--only", "limits:*")
    values, sources = doc["params"]["values"], doc["params"]["sources"]
    assert values["user"] != "nobody", (values, sources)
    assert sources["user"] != "running process", sources
    assert not (values["service"] == "squid" and sources["service"].startswith("running process")), sources
    if how == "copy-of-sleep":          # it is named, with why, where the operator looks
        assert f"pid {p.pid}" in json.dumps(doc), doc["notes"]


def test_the_real_nginx_binary_run_by_a_user_is_not_the_proxy(sandbox, procs, tmp_path):
    """nobody runs Debian's own /usr/sbin/nginx (a root-owned executable) from its own prefix: a name
    and a trusted binary do not make a service; nobody is not adopted as the playbook's user."""
    prefix = Path(tempfile.mkdtemp(prefix="pt-nginx-nobody-", dir="/tmp"))
    try:
        (prefix / "logs").mkdir()
        (prefix / "nginx.conf").write_text(
            f"daemon off; master_process on; worker_processes 1; pid {prefix}/nginx.pid; error_log {prefix}/e.log;\n"
            "events { worker_connections 16; }\nhttp { access_log off; server { listen 127.0.0.1:0; } }\n")
        subprocess.run(["chown", "-R", "nobody:nogroup", str(prefix)], check=True)
        procs([*NOBODY, "/usr/sbin/nginx", "-p", str(prefix), "-c", str(prefix / "nginx.conf")], "nginx")
        r = proxytune("tune", "export", "--format", "ansible", "--only", "limits:*", env=LIVE)
        assert r.returncode == 0, r.stderr
        assert 'proxytune_user: "nobody"' not in r.stdout, r.stdout[:2000]
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


# ---------------------------------------------------------------- limits.d: never a user's name, never live under --root

@pytest.mark.parametrize("how", ["apply --root", "export limits.d"])
def test_limits_d_never_names_a_user_who_started_a_fake(sandbox, procs, nobody_bin, how):
    """With --service squid given, {user} was still taken from every process named squid, under
    --root too (whose processes are not that root's): `nobody soft nofile 65536` in limits.d."""
    fake(procs, nobody_bin)
    if how == "apply --root":
        r = proxytune("tune", "apply", "--service", "squid", "--only", "limits:*", "--persist", "--yes")
        assert r.returncode == 0, r.stderr
        text = "".join(f.read_text() for f in (sandbox.root / "etc/security/limits.d").iterdir())
    else:
        r = proxytune("tune", "export", "--format", "limits.d", "--service", "squid", env=LIVE)
        assert r.returncode == 0, r.stderr
        text = r.stdout
    assert "nobody" not in text and "proxy" in text, text


# ---------------------------------------------------------------- rlimit:*: only the service's processes

def test_rlimit_reads_the_root_started_tree_and_ignores_a_users_fake(sandbox, procs, nobody_bin, root_bin):
    """root's squid (soft 2000) and nobody's fake squid (soft 64): the lowest soft limit was the
    fake's (or, without CAP_SYS_RESOURCE, reading it failed and refused every apply)."""
    master, worker = real(procs, root_bin)
    p = fake(procs, nobody_bin)
    r, doc = check_json("--service", "squid", "--only", "rlimit:*")
    (row,) = doc["settings"]
    assert row["status"] != "error", row
    assert row["current"] == 2000, row
    assert f"pid {p.pid}" in row["note"], row


def test_rlimit_apply_raises_the_service_and_never_touches_a_users_process(sandbox, procs, nobody_bin, root_bin,
                                                                          tmp_path):
    import resource
    master, worker = real(procs, root_bin, user="root")     # prlimit on another uid needs CAP_SYS_RESOURCE
    p = fake(procs, nobody_bin)
    prof = tmp_path / "nofile.toml"
    prof.write_text('[profile]\nos = "linux"\n[rlimit."{service}:nofile"]\nat_least = 3000\nreason = "t"\n'
                    'source = "t"\n')
    r = proxytune("tune", "apply", "-p", str(prof), "--service", "squid", "--yes", env=LIVE)
    assert r.returncode == 0, r.stderr
    assert resource.prlimit(master, resource.RLIMIT_NOFILE) == (3000, 4096)
    assert resource.prlimit(worker, resource.RLIMIT_NOFILE) == (3000, 4096)
    assert Path(f"/proc/{p.pid}/limits").read_text().count(" 64 ") >= 2       # untouched: 64 64
    assert proxytune("tune", "rollback", "--yes", env=LIVE).returncode == 0
    assert resource.prlimit(master, resource.RLIMIT_NOFILE) == (2000, 4096)


def test_under_root_no_live_process_is_read(sandbox, procs, nobody_bin):
    """--root DIR audits DIR: the running processes are this host's, not DIR's."""
    fake(procs, nobody_bin)
    r = proxytune("tune", "check", "--json", "--service", "squid", "--only", "rlimit:*")
    doc = json.loads(r.stdout)["data"]
    (row,) = doc["settings"]
    assert row["status"] == "n/a" and "--root" in row["note"], row
    assert doc["observations"]["processes"] == [] and not doc["observations"]["running"], doc["observations"]


# ---------------------------------------------------------------- doctor --comm

def test_doctor_comm_watches_the_service_tree_not_a_users_namesake(procs, nobody_bin, root_bin):
    from proxytune.probes import proc
    master, worker = real(procs, root_bin, "nginx", "www-data")
    p = fake(procs, nobody_bin, "nginx")
    pids = proc.resolve(None, "nginx")
    assert master in pids and worker in pids and p.pid not in pids, (pids, p.pid)


def test_a_users_fake_nginx_near_its_fd_limit_does_not_page(procs, nobody_bin):
    """Only nobody's fake nginx runs, at 16 fds: the plugin said WARNING or CRITICAL about it.
    Now it is UNKNOWN (nothing of the nginx service to watch), naming the process it ignored."""
    if not shutil.which("bpftrace"):
        pytest.skip("needs bpftrace")
    p = fake(procs, nobody_bin, "nginx", nofile="16:16")
    r = proxytune("doctor", "--comm", "nginx", "--duration", "1", "--no-perf", "--format", "nagios", env=LIVE)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.startswith("PROXYTUNE UNKNOWN") and f"pid {p.pid}" in r.stdout, r.stdout


# ---------------------------------------------------------------- the monitoring timer and Nagios

@pytest.mark.parametrize("fmt", ["nagios", "prometheus"])
def test_monitoring_audits_no_users_fake(sandbox, procs, nobody_bin, tmp_path, fmt):
    """The timer's own command line (`tune check --format prometheus -o FILE`), and the Nagios
    check: nobody's fake nginx with soft limit 64 was 'the running nginx' and warned."""
    fake(procs, nobody_bin, "nginx")
    if fmt == "prometheus":
        out = tmp_path / "textfile" / "proxytune.prom"
        r = proxytune("tune", "check", "--format", "prometheus", "-o", str(out), "--only", "sysctl:fs.file-max",
                      env=LIVE)
        assert r.returncode in (0, 1), r.stderr
        line = next(x for x in out.read_text().splitlines() if x.startswith("proxytune_proxy_warnings{"))
        assert line.endswith(" 0"), line
    else:
        r = proxytune("tune", "check", "--format", "nagios", "--service", "nginx", "--only", "sysctl:fs.file-max",
                      env=LIVE)
        assert "from the running nginx" not in r.stdout and "proxy_warnings=0" in r.stdout, r.stdout


def test_the_playbooks_prlimit_task_never_touches_a_users_process(sandbox, procs, nobody_bin, root_bin, tmp_path):
    """The exported playbook runs its rlimit task on every host: `pgrep -x squid` took every user's
    squid. Run here as the host would (prlimit recorded, not run): only the service's processes."""
    master, worker = real(procs, root_bin)
    p = fake(procs, nobody_bin)
    touched = playbook_prlimit(tmp_path)
    assert f"--pid {master} " in touched and f"--pid {worker} " in touched, touched
    assert f"--pid {p.pid} " not in touched, touched


def playbook_prlimit(tmp_path) -> str:
    """The exported playbook's rlimit task run here as a host would, prlimit recorded (not run)."""
    r = proxytune("tune", "export", "--format", "ansible", "--service", "squid", "--user", "proxy",
                  "--only", "rlimit:*")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "ansible.builtin.shell:" in x)
    script = json.loads(line.split("!unsafe ", 1)[1])
    shims = tmp_path / "bin"
    shims.mkdir(exist_ok=True)
    log = tmp_path / "prlimit.log"
    (shims / "prlimit").write_text(f'#!/bin/sh\necho "$@" >> {log}\necho 1024\n')
    (shims / "prlimit").chmod(0o755)
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{shims}:/usr/bin:/bin:/usr/sbin:/sbin"})
    assert r.returncode == 0, r.stderr
    return log.read_text() if log.exists() else ""


# ---------------------------------------------------------------- second attack round (variants not used above)

def test_a_fake_that_looks_like_roots_squid_from_its_own_user_namespace_is_not_the_proxy(sandbox, procs,
                                                                                        nobody_bin):
    """nobody, root in a user namespace of its own, bind-mounts its copy of sleep over /usr/sbin/squid
    and runs that: /proc/PID/exe reads `/usr/sbin/squid`, and inside the namespace it is uid 0."""
    if not Path("/usr/sbin/squid").exists():
        pytest.skip("needs /usr/sbin/squid to hide")
    script = f"mount --bind {nobody_bin / 'squid'} /usr/sbin/squid && exec /usr/sbin/squid 600"
    p = procs([*NOBODY, "unshare", "-rm", "sh", "-c", script], "squid")
    assert os.readlink(f"/proc/{p.pid}/exe") == "/usr/sbin/squid"
    r, doc = check_json("--only", "limits:*")
    assert doc["params"]["values"]["user"] != "nobody" and "running process" not in doc["params"]["sources"]["user"]
    r, doc = check_json("--service", "squid", "--only", "rlimit:*")
    (row,) = doc["settings"]
    assert row["status"] == "n/a" and f"pid {p.pid}" in row["note"], row


def test_a_system_accounts_fake_is_not_touched_by_the_playbook_either(sandbox, procs, nobody_bin, root_bin,
                                                                      tmp_path):
    """www-data (a web application's account: a system user) runs a fake squid. The playbook's uid
    test let every system user's process through; the tree rule does not."""
    import pwd
    master, worker = real(procs, root_bin)
    web = pwd.getpwnam("www-data")
    d = Path(tempfile.mkdtemp(prefix="pt-www-", dir="/tmp"))
    try:
        shutil.copy("/bin/sleep", d / "squid")
        subprocess.run(["chown", "-R", f"{web.pw_uid}:{web.pw_gid}", str(d)], check=True)
        d.chmod(0o755)
        p = procs(["setpriv", f"--reuid={web.pw_uid}", f"--regid={web.pw_gid}", "--clear-groups",
                   str(d / "squid"), "600"], "squid")
        touched = playbook_prlimit(tmp_path)
        assert f"--pid {master} " in touched and f"--pid {p.pid} " not in touched, touched
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_what_a_fake_is_called_reaches_no_terminal_or_plugin_line_as_control_characters(sandbox, procs):
    """The fake lives in a directory whose name carries an escape sequence and a newline: the note that
    names it is one line of text in the table, the JSON and the Nagios line."""
    d = Path(tempfile.mkdtemp(prefix="pt-esc-", dir="/tmp")) / "x\x1b]0;pwned\x07\nnote: forged"
    d.mkdir()
    try:
        shutil.copy("/bin/sleep", d / "squid")
        subprocess.run(["chown", "-R", "nobody:nogroup", str(d.parent)], check=True)
        d.parent.chmod(0o755)
        d.chmod(0o755)
        p = procs([*NOBODY, str(d / "squid"), "600"], "squid")
        r, doc = check_json("--only", "limits:*")
        assert any(f"pid {p.pid}" in n and "\\x1b]0;pwned" in n for n in doc["notes"]), doc["notes"]
        for args in (["--only", "limits:*"], ["--only", "limits:*", "--format", "nagios"]):
            r = proxytune("tune", "check", *args, env=LIVE)
            out = r.stdout + r.stderr
            assert "\x1b" not in out and "\x07" not in out and "\nnote: forged" not in out, out
    finally:
        shutil.rmtree(d.parent, ignore_errors=True)


def test_many_fakes_make_one_bounded_note(sandbox, procs, nobody_bin):
    fakes = [fake(procs, nobody_bin) for _ in range(12)]
    r, doc = check_json("--only", "limits:*")
    note = next(n for n in doc["notes"] if "ignored" in n)
    assert note.count("pid ") == proxytree_shown() and "(+7 more)" in note, note
    assert sum(f"pid {p.pid} " in note for p in fakes) == proxytree_shown()


def proxytree_shown() -> int:
    from proxytune.core import proxytree
    return proxytree.SHOWN


# ---------------------------------------------------------------- the watcher

def test_the_watcher_never_watches_a_users_namesake_nor_prefers_it(sandbox, procs, nobody_bin, root_bin):
    """`proxytune watch` (the service's default: no --pid, no --unit) found masters by name: nobody's
    copy of sleep called squid was watched, and beside root's nginx it was chosen first (squid comes
    first in the detection order). Now the rule of core/proxytree.py decides, and the fake is named."""
    from proxytune.probes import locate
    others = locate.masters()[0]        # a real proxy of the host's (none in CI): then it may be the one watched
    f = fake(procs, nobody_bin, "squid")
    pids, line = locate.Locator().find()
    assert f.pid not in pids and line and f"pid {f.pid}" in line and "ignored" in line, line   # named, with why
    if not others:
        assert pids == [] and line.startswith("no proxy is running; waiting for one; ")
    assert f.pid not in locate.Locator(unit="squid").find()[0]                            # nor by its unit's name
    master, worker = real(procs, root_bin, "nginx", user="www-data")
    pids, line = locate.Locator().find()
    assert f.pid not in pids, (pids, line)
    if not others:
        assert pids[0] == master and f"watching nginx master pid {master}" in line, (pids, line)

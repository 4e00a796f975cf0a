"""Adversarial tests from a second review: a tired operator and a local attacker against
`tune apply` / `tune rollback`, the bench JSON, and `report --from`.

Each test started as a strict xfail naming the finding; all were fixed since.
Live sysctls are only touched inside `unshare -n`; files only under tmp_path."""

import json
import os
import pty
import resource
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, in_netns, needs_root, proxytune

PY = [str(REPO / ".venv/bin/python"), str(REPO / "cli.py")]
# Running proxies of other tests on this machine would put their live limits in the plan.
NO_LIVE_PROCS = ["--skip", "rlimit:*"]
APPLY_FILES = [*PY, "tune", "apply", "-p", "linux/proxy", "--files-only", *NO_LIVE_PROCS]


def _answer_prompt(argv, env, action, answer: bytes, timeout=120):
    """Run argv on a pty; at the apply prompt run `action` (a callable), then type `answer`.
    Returns (exit code, everything printed after the prompt)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe(argv[0], argv, {**os.environ, **env})
    out, deadline, prompted = b"", time.time() + timeout, False
    while time.time() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
        if not prompted and b"step(s)?" in out:
            prompted = True
            action()
            _wait_reading_stdin(pid)
            os.write(fd, answer)
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert prompted, out.decode(errors="replace")
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace").split("step(s)?", 1)[1]


def _wait_reading_stdin(pid: int, timeout: float = 30) -> None:
    """Until the child blocks in read(0, ...): a prompt on the screen is not yet a process waiting
    for input, and a Ctrl-C landing between Python's signal check and its blocking read is only
    seen at the next key (CPython's my_fgets), which a test never types."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            call = Path(f"/proc/{pid}/syscall").read_text().split()
        except OSError:
            return
        if call[:2] == ["0", "0x0"]:            # x86-64 read(2) on fd 0
            return
        time.sleep(0.01)


# -- tune apply: exactly what was confirmed -------------------------------------------------

@needs_root
def test_file_swapped_for_symlink_at_the_prompt_is_refused(sandbox, tmp_path):
    conf = sandbox.root / "etc/sysctl.d/90-proxytune.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("# mine\n")
    victim = tmp_path / "victim"
    victim.write_text("victim\n")

    def swap():
        conf.unlink()
        conf.symlink_to(victim)
    code, after = _answer_prompt(APPLY_FILES, {}, swap, b"y\n")
    assert code == 2 and "refusing to follow the symlink" in after
    assert victim.read_text() == "victim\n" and not list(sandbox.state_dir.glob("journal/*"))
    assert not list(sandbox.root.rglob("50-proxytune.conf"))      # no other file step ran either


def _chmod_at_the_prompt(sandbox):
    """Our sysctl.d file exists at the plan; it is made 0600 while the prompt waits; then `y`."""
    conf = sandbox.root / "etc/sysctl.d/90-proxytune.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("# mine\n")
    code, after = _answer_prompt(APPLY_FILES, {}, lambda: conf.chmod(0o600), b"y\n")
    return conf, code, after


@needs_root
def test_mode_changed_at_the_prompt_is_refused_and_says_what_changed(sandbox):
    conf, code, after = _chmod_at_the_prompt(sandbox)
    assert code == 2 and "changed since the plan was shown" in after
    assert oct(conf.stat().st_mode & 0o777) == "0o600"


@needs_root
def test_mode_change_refusal_names_the_mode(sandbox):
    conf, code, after = _chmod_at_the_prompt(sandbox)
    line = next(x for x in after.splitlines() if "error:" in x)
    now, _, shown = line.partition("shown as")
    assert now.split("it is now", 1)[1].strip(" ,") != shown.split(";")[0].strip()


@needs_root
@pytest.mark.parametrize("answer, code", [(b"\x03", 130), (b"\x04", 2), (b"n\n", 2)])
def test_ctrl_c_eof_or_no_at_the_prompt_changes_nothing(sandbox, answer, code):
    got, after = _answer_prompt(APPLY_FILES, {},
                                lambda: None, answer)
    assert got == code and "nothing was changed" in after
    assert not [p for p in sandbox.root.rglob("*") if p.is_file()]


@needs_root
@pytest.mark.parametrize("pattern", ["[", "sysctl:net.*]", "x\ny", "a;rm -rf /", "\x1b[31mred", "--yes", ""])
def test_odd_only_patterns_are_one_line_exit_2(sandbox, pattern):
    r = proxytune("tune", "apply", "-p", "linux/proxy", "--only", pattern, "--files-only", "--yes")
    assert r.returncode == 2 and r.stderr.startswith("proxytune: error: ")
    assert "\x1b" not in r.stderr and len(r.stderr.splitlines()) <= 2
    assert not [p for p in sandbox.root.rglob("*") if p.is_file()]


@needs_root
def test_a_skip_that_matches_nothing_is_refused(sandbox):
    r = proxytune("tune", "plan", "-p", "linux/proxy", "--only", "sysctl:net.*",
                  "--skip", "sysctl:net.ipv4.tcp_tw_reus", netns=True)      # typo: tcp_tw_reuse
    assert r.returncode == 2 and "tcp_tw_reus" in r.stderr


@needs_root
def test_rollback_after_a_crash_keeps_hand_changes_on_steps_never_reached(sandbox):
    r = in_netns("""
        PROXYTUNE_FAULT_AFTER_STEP=2 $PT tune apply -p linux/proxy --only 'sysctl:net.*' --yes >/dev/null 2>&1 || true
        sysctl -qw net.ipv4.tcp_fin_timeout=45        # step 5: the dead apply never got there
        $PT tune rollback --yes >/dev/null 2>&1 || true
        sysctl -n net.ipv4.tcp_fin_timeout
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "45"


@needs_root
def test_rollback_keeps_a_hand_change_on_the_step_a_dead_apply_stopped_in(sandbox):
    """The apply died after step 2 was recorded, before step 3's write was issued (the journal
    says so before each write): step 3 was never ours, so a hand change there is kept silently,
    even with --force (issue 20: a step counts as reached only once its write was issued)."""
    r = in_netns("""
        PROXYTUNE_FAULT_AFTER_STEP=2 $PT tune apply -p linux/proxy --only 'sysctl:net.*' --yes >/dev/null 2>&1 || true
        sysctl -qw net.core.somaxconn=5000
        $PT tune rollback --yes 2>&1 && echo "exit=0" || echo "exit=$?"
        sysctl -n net.core.somaxconn
        $PT tune rollback --force --yes >/dev/null 2>&1 || true
        sysctl -n net.core.somaxconn
    """)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert "exit=0" in out and out[-2] == "5000" and out[-1] == "5000", r.stdout
    assert "somaxconn" not in r.stdout


# -- bench JSON -----------------------------------------------------------------------------

@needs_root
def test_bench_with_a_read_only_cache_dir_is_one_clear_line(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c",
                        f"mount --bind {cache} {cache} && mount -o remount,bind,ro {cache} && "
                        f"PROXYTUNE_CACHE_DIR={cache} {' '.join(PY)} bench fdscan --quick --json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("proxytune: error: ")
    json.loads(r.stdout)


def test_bench_with_a_failing_compiler_is_valid_json_and_exit_2(tmp_path):
    cache = tmp_path / "cache"
    r = proxytune("bench", "fdscan", "--quick", "--json", env={"CC": "/bin/false", "PROXYTUNE_CACHE_DIR": str(cache)})
    assert r.returncode == 2 and r.stderr.startswith("proxytune: error: bench fdscan: building fdscan failed")
    assert json.loads(r.stdout)["data"]["available"] is False


# -- report --from hostile files ------------------------------------------------------------

def _report_from(path, tmp_path, limit_as=None, timeout=60):
    def limit():
        if limit_as:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))
    try:
        return subprocess.run([*PY, "report", "--no-bench", "--from", str(path), "-o", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=timeout, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        return None


def test_report_from_a_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    r = _report_from(fifo, tmp_path, timeout=30)
    assert r is not None and r.returncode == 2 and "not a regular file" in r.stderr


def test_report_from_dev_zero_is_bounded(tmp_path):
    link = tmp_path / "r.json"
    link.symlink_to("/dev/zero")
    r = _report_from(link, tmp_path, limit_as=2 << 30)      # bounded: never let it eat the machine
    assert r is not None and r.returncode == 2 and "internal error" not in r.stderr


def test_report_from_deeply_nested_json_is_one_clear_line(tmp_path):
    deep = tmp_path / "r.json"
    deep.write_text("[" * 100000)
    r = _report_from(deep, tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("proxytune: error: ")


EVIL = "<script>alert(1)</script> | a | b\n| x |\n```"


def _evil_fdscan(tmp_path):
    """A saved fdscan result (a real one's shape) whose strings are hostile."""
    doc = {"schema": "proxytune.result/1", "kind": "bench", "created": "2026-11-23T12:00:00Z",
           "host": {"hostname": EVIL, "os": EVIL, "kernel": "6", "arch": "x86_64", "cpu_model": EVIL,
                    "cores": 2, "memory_kib": 1, "virtualised": "no", "filesystems": []},
           "data": {"bench": "fdscan", "quick": True, "variants": {str(i): EVIL for i in range(1, 6)},
                    "points": [{"variant": v, "n": n, "handlers_per_call": 9.0, "command": EVIL,
                                "ns_per_call": {"median": 100.0 * v, "min": 90.0 * v, "max": 110.0 * v, "n": 5,
                                                "iqr_rel": 0.1, "ci95": [90.0 * v, 110.0 * v]}}
                               for v in range(1, 6) for n in (100, 1000)],
                    "misses": [], "miss_source": "unavailable", "miss_source_note": EVIL}}
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(doc))
    return path


def _render_evil(tmp_path):
    r = _report_from(_evil_fdscan(tmp_path), tmp_path, timeout=120)
    assert r.returncode in (0, 1), r.stderr          # a schema change that refuses the file must update it
    return tmp_path / "out"


def test_report_html_has_no_live_script_from_a_saved_result(tmp_path):
    out = _render_evil(tmp_path)
    html = (out / "report.html").read_text()
    assert "<script>alert(1)" not in html and "&lt;script&gt;" in html


def test_report_md_tables_survive_newlines_in_strings(tmp_path):
    out = _render_evil(tmp_path)
    md = (out / "report.md").read_text().splitlines()
    start = next(i for i, line in enumerate(md) if line.startswith("| variant |"))
    width = md[start].count(" | ")
    rows = []
    for line in md[start + 2:]:
        if not line.strip():
            break
        rows.append(line)
    assert rows and all(line.startswith("| ") and line.replace("\\|", "").count(" | ") == width for line in rows)


@needs_root
def test_apply_json_to_a_file_keeps_the_prompt_on_the_terminal(sandbox, tmp_path):
    controller, terminal = pty.openpty()
    with open(tmp_path / "apply.json", "w") as out:
        p = subprocess.Popen([*PY, "tune", "apply", "-p", "linux/proxy", "--files-only", "--json", *NO_LIVE_PROCS],
                             stdin=terminal, stdout=out, stderr=subprocess.PIPE)
        time.sleep(5)
        os.write(controller, b"y\n")
        p.communicate(timeout=120)
    os.close(controller)
    os.close(terminal)
    json.loads((tmp_path / "apply.json").read_text())

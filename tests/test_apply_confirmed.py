"""`tune apply` runs exactly the steps the user confirmed: a host change
between the prompt and the answer is refused (exit 2, one line), never
turned into steps nobody saw."""

import json
import os
import select
import subprocess
import time

import pytest

from conftest import REPO, in_netns, needs_root
from proxytune.core.errors import ProxytuneError
from proxytune.tune import apply as apply_mod, plan as plan_mod

LIMITS = ("--only", "limits:*", "--user", "proxy")


def _read_until(fd: int, marker: str, timeout: float = 60.0) -> str:
    seen, end = b"", time.monotonic() + timeout
    while marker.encode() not in seen:
        left = end - time.monotonic()
        assert left > 0, f"no {marker!r} in {seen!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            assert chunk, f"process ended before {marker!r}: {seen!r}"
            seen += chunk
    return seen.decode()


def _apply_changing_host_at_prompt(sandbox, change) -> subprocess.CompletedProcess:
    """Run `tune apply` on a terminal; at its prompt, `change()` the host, then answer y."""
    import pty
    master, slave = pty.openpty()
    p = subprocess.Popen([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "tune", "apply", *LIMITS],
                         stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
    os.close(slave)
    try:
        shown = _read_until(p.stdout.fileno(), "Apply these")
        assert "create" in shown and "90-proxytune.conf" in shown
        change()
        os.write(master, b"y\n")
        out, err = p.communicate(timeout=60)
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
    return subprocess.CompletedProcess(p.args, p.returncode, out.decode(), err.decode())


def test_a_file_written_by_hand_at_the_prompt_is_not_overwritten(sandbox):
    target = sandbox.root / "etc/security/limits.d/90-proxytune.conf"
    by_hand = "proxy soft nofile 1024   # the operator's own, written while apply waited\n"

    def operator_writes():
        target.parent.mkdir(parents=True)
        target.write_text(by_hand)
    r = _apply_changing_host_at_prompt(sandbox, operator_writes)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.startswith("proxytune:")]
    assert len(lines) == 1 and "changed since" in lines[0] and "90-proxytune.conf" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert target.read_text() == by_hand
    assert not (sandbox.state_dir / "journal").exists() or not list((sandbox.state_dir / "journal").iterdir())


def test_api_refuses_confirmed_steps_that_no_longer_match(sandbox):
    params = {"service": None, "user": "proxy", "cache_dirs": []}
    plan = plan_mod.build("linux/proxy", sandbox, params, ("limits:*",), ())
    confirmed, _ = apply_mod.steps_for(plan, sandbox, False)
    assert [s["kind"] for s in confirmed] == ["file"]
    target = sandbox.root / "etc/security/limits.d/90-proxytune.conf"
    target.parent.mkdir(parents=True)
    target.write_text("# someone else's\n")
    with pytest.raises(ProxytuneError, match="changed since"):
        apply_mod.apply_plan(plan, sandbox, confirmed=confirmed)
    assert target.read_text() == "# someone else's\n"


def test_api_refuses_a_step_nobody_confirmed(sandbox):
    """Shown: no step. Planned again under the lock: one. It must not run."""
    params = {"service": None, "user": "proxy", "cache_dirs": []}
    plan = plan_mod.build("linux/proxy", sandbox, params, ("limits:*",), ())
    with pytest.raises(ProxytuneError, match="changed since the plan was shown: it now needs a step that was not"):
        apply_mod.apply_plan(plan, sandbox, confirmed=[])
    assert not (sandbox.root / "etc/security").exists()
    assert not (sandbox.state_dir / "journal").exists() or not list((sandbox.state_dir / "journal").iterdir())


def test_api_refuses_a_confirmed_step_done_meanwhile_by_someone_else(sandbox):
    params = {"service": None, "user": "proxy", "cache_dirs": []}
    plan = plan_mod.build("linux/proxy", sandbox, params, ("limits:*",), ())
    confirmed, _ = apply_mod.steps_for(plan, sandbox, False)
    target = sandbox.root / "etc/security/limits.d/90-proxytune.conf"
    target.parent.mkdir(parents=True)
    target.write_text(confirmed[0]["new"])
    with pytest.raises(ProxytuneError, match="no longer needed"):
        apply_mod.apply_plan(plan, sandbox, confirmed=confirmed)
    assert target.read_text() == confirmed[0]["new"]


def test_api_runs_the_confirmed_steps_when_nothing_changed(sandbox):
    params = {"service": None, "user": "proxy", "cache_dirs": []}
    plan = plan_mod.build("linux/proxy", sandbox, params, ("limits:*",), ())
    confirmed, _ = apply_mod.steps_for(plan, sandbox, False)
    outcome = apply_mod.apply_plan(plan, sandbox, confirmed=json.loads(json.dumps(confirmed)))
    assert [s["path"] for s in outcome.steps] == [confirmed[0]["path"]]
    assert (sandbox.root / "etc/security/limits.d/90-proxytune.conf").read_text() == confirmed[0]["new"]


@needs_root
def test_a_sysctl_set_by_hand_at_the_prompt_is_refused_in_a_netns(sandbox, tmp_path):
    """A live value (net.core.somaxconn, private to a network namespace) changed between the
    prompt and the answer: the confirmed step's old value no longer holds; nothing is written."""
    script = tmp_path / "race.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {str(REPO / "tests")!r})
import conftest
from pathlib import Path
from proxytune.core.errors import ProxytuneError
from proxytune.tune import apply as apply_mod, plan as plan_mod
from proxytune.tune.host import Host
KNOB = Path("/proc/sys/net/core/somaxconn")
KNOB.write_text("128")
host = Host(root=Path({str(sandbox.root)!r}), state_dir=Path({str(sandbox.state_dir)!r}))
plan = plan_mod.build("linux/proxy", host, {{}}, ("sysctl:net.core.somaxconn",), ())
confirmed, _ = apply_mod.steps_for(plan, host, False)
assert [s["old"] for s in confirmed] == ["128"], confirmed
KNOB.write_text("256")                       # the operator, while the prompt waits
try:
    apply_mod.apply_plan(plan, host, confirmed=confirmed)
    print("APPLIED")
except ProxytuneError as e:
    print("REFUSED", e.message)
print("NOW", KNOB.read_text().strip())
""")
    r = in_netns(f"{REPO}/.venv/bin/python {script}")
    assert r.returncode == 0, r.stderr
    assert "REFUSED sysctl:net.core.somaxconn changed since the plan was shown: it is now 256, shown as 128" \
        in r.stdout, r.stdout
    assert "NOW 256" in r.stdout

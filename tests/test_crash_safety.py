"""Crash safety: SIGKILL the apply after each of its steps in turn, then
`tune rollback` restores everything; a failure mid-apply undoes what it did;
an interrupted apply blocks a new one until rolled back."""

import json

from conftest import in_netns, needs_root, proxytune

STEPS = 7   # 5 runtime sysctl writes in a fresh namespace, plus sysctl.d and limits.d files
STATE = ("cat /proc/sys/net/ipv4/ip_local_port_range /proc/sys/net/core/somaxconn /proc/sys/net/ipv4/tcp_fin_timeout "
         "/proc/sys/net/ipv4/tcp_max_syn_backlog /proc/sys/net/ipv4/tcp_tw_reuse | xargs; "
         "find $PROXYTUNE_ROOT -type f | sort | xargs -r md5sum")


@needs_root
def test_sigkill_after_each_step_then_rollback_restores(sandbox):
    limits = sandbox.root / "etc/security/limits.conf"
    limits.parent.mkdir(parents=True)
    limits.write_text("# site limits\n")
    script = f"""
before=$({STATE})
n=0
while [ $n -le {STEPS} ]; do
  set +e
  PROXYTUNE_FAULT_AFTER_STEP=$n $PT tune apply --only 'sysctl:net.*' --only 'limits:*' --user proxy --persist --yes >/dev/null 2>&1
  rc=$?
  set -e
  [ $rc -eq 137 ] || {{ echo "step $n: apply was not killed (rc $rc)"; exit 1; }}
  $PT tune apply --only 'sysctl:net.*' --yes >/dev/null 2>&1 && {{ echo "step $n: apply ran over an interrupted one"; exit 1; }}
  $PT tune rollback --yes >/dev/null
  after=$({STATE})
  [ "$before" = "$after" ] || {{ printf 'step %s: not restored\\n%s\\n---\\n%s\\n' $n "$before" "$after"; exit 1; }}
  echo "step $n restored"
  n=$((n+1))
done
$PT tune history --json
"""
    r = in_netns(script)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("restored") == STEPS + 1
    history = json.loads(r.stdout[r.stdout.index("\n{") + 1:])["data"]["entries"]     # the envelope, after the steps
    assert [h["done"] for h in history] == list(range(STEPS + 1))
    assert {h["steps"] for h in history} == {STEPS}
    assert {h["state"] for h in history} == {"rolled-back"}


def test_failure_mid_apply_undoes_earlier_steps(sandbox, tmp_path):
    """A real failure: the drop-in directory is a file, so writing the drop-in fails
    (ENOTDIR) after limits.d was already written; apply must remove that again."""
    (sandbox.root / "etc/security").mkdir(parents=True)
    (sandbox.root / "etc/systemd/system").mkdir(parents=True)
    (sandbox.root / "etc/systemd/system/squid.service.d").write_text("a file where a directory should be\n")
    prof = tmp_path / "p.toml"
    prof.write_text('[profile]\nos = "linux"\n'
                    '[limits."proxy:nofile"]\nat_least = 70000\nreason = "t"\nsource = "t"\n'
                    '[service."squid:LimitNOFILE"]\nat_least = 70000\nreason = "t"\nsource = "t"\n')
    r = proxytune("tune", "plan", "-p", str(prof), "--service", "squid", "--json")
    steps = json.loads(r.stdout)["data"]["steps"]
    assert [s["path"].split("/etc/")[1] for s in steps] == [
        "security/limits.d/90-proxytune.conf", "systemd/system/squid.service.d/50-proxytune.conf"]
    r = proxytune("tune", "apply", "-p", str(prof), "--service", "squid", "--yes")
    assert r.returncode == 2
    assert "apply failed" in r.stderr and "Not a directory" in r.stderr, r.stderr
    assert "undid every step done" in r.stderr and len(r.stderr.splitlines()) == 2, r.stderr
    assert not (sandbox.root / "etc/security/limits.d/90-proxytune.conf").exists()
    history = json.loads(proxytune("tune", "history", "--json").stdout)["data"]["entries"]
    assert history[-1]["state"] == "failed-undone"
    assert proxytune("tune", "rollback", "--yes").returncode == 2   # nothing open to roll back

"""Rolling apply and fleet rollback.

apply: the canary first (apply, proxytune's own verify, then the operator's
--verify-cmd); if that fails, the canary is rolled back and nobody else is
touched. Then the rest in --serial batches; the first host whose apply or
verify fails stops the rollout, and the hosts that failed are rolled back.
Every host's journal entry id is recorded in a fleet run file before the
next batch starts, so `fleet rollback` can undo what a run reached.
"""

from . import fleet_inventory as inv, fleet_play as fp, fleet_state
from proxytune.core.errors import ProxytuneError
from .fleet import FAILED, OK, SKIPPED, Fleet, host_result, play, result, verify_locally



def _journal_of(doc) -> str | None:
    journal = doc.get("data", {}).get("journal") if isinstance(doc, dict) else None
    return inv.check_arg("journal id", journal) if journal else None


def _apply_hosts(fleet: Fleet, run: dict, state_dir, hosts: list[str], serial: int | None) -> dict:
    """Apply on `hosts`, recording each host's journal id the moment its result arrives."""
    extra = ("--yes",) + (("--persist",) if fleet.persist else ())
    task = fp.run_task(fleet.tune_argv("apply", *extra), fleet.digest, (0,))

    def record(ev):
        if ev["task"] == fp.RUN_TASK:
            r = host_result([ev])
            run["hosts"][ev["host"]] = {"journal": _journal_of(r["doc"]), "status": r["status"]}
            fleet_state.save(state_dir, run)
    events = play(fleet, hosts, [task], serial=serial, stop_on_failure=True, on_event=record)
    out = {h: host_result(events[h]) for h in hosts}
    for h, r in out.items():
        r["journal"] = _journal_of(r.get("doc"))
        r["steps"] = len((r.get("doc") or {}).get("data", {}).get("steps", []))
        if r["journal"] or r["status"] != SKIPPED:
            run["hosts"][h] = {"journal": r["journal"], "status": r["status"]}
    fleet_state.save(state_dir, run)
    return out


def rollback_hosts(fleet: Fleet, journals: dict[str, str]) -> dict:
    """Run `tune rollback --id ID` on each host for its own journal entry."""
    if not journals:
        return {}
    argv = ["tune", "rollback", "--yes", "--json", "--id", "{{ proxytune_fleet_journal[inventory_hostname] }}"]
    task = fp.run_task(argv, fleet.digest, (0,), name=fp.ROLLBACK_TASK)
    events = play(fleet, list(journals), [task], extra_vars={"proxytune_fleet_journal": journals})
    return {h: host_result(events[h], fp.ROLLBACK_TASK) for h in journals}


def apply(fleet: Fleet, state_dir, canary: str | None, serial: int | None, verify_cmd: str | None) -> dict:
    if canary and canary not in fleet.hosts:
        raise ProxytuneError(f"--canary {canary!r} is not among the hosts this run reaches",
                                 f"hosts: {', '.join(fleet.hosts[:10])}")
    run = fleet_state.new_run(fleet.profile_ref, fleet.inventory, fleet.hosts)
    fleet_state.save(state_dir, run)
    hosts: dict = {}
    rest = [h for h in fleet.hosts if h != canary]
    stopped = ""
    if canary:
        hosts.update(_apply_hosts(fleet, run, state_dir, [canary], None))
        ok, why = (hosts[canary]["status"] == OK, hosts[canary]["error"])
        if ok:
            ok, why = verify_locally(verify_cmd, canary, fleet.progress)
        if not ok:
            stopped = f"canary {canary} failed verify ({why}); rolled back, rollout stopped"
            hosts[canary].update(status=FAILED, error=why)
    if rest and not stopped:
        hosts.update(_apply_hosts(fleet, run, state_dir, rest, serial))
        failed = [h for h in rest if hosts[h]["status"] != OK]
        if failed:
            stopped = f"rollout stopped: {', '.join(failed[:5])} failed; failed hosts rolled back"
    for h in fleet.hosts:
        hosts.setdefault(h, {"status": SKIPPED, "fingerprint": None, "settings": [], "summary": {},
                             "exit": None, "error": "rollout stopped before this host", "journal": None})
    undo = {h: hosts[h]["journal"] for h in hosts if hosts[h]["status"] == FAILED and hosts[h].get("journal")}
    rolled = rollback_hosts(fleet, undo)
    for h, r in rolled.items():
        hosts[h]["rolled_back"] = r["status"] == OK
        run["hosts"][h]["rolled_back"] = r["status"] == OK
    run["state"] = "stopped" if stopped else "applied"
    if not fleet_state.pending(run):
        run["state"] = "rolled-back" if rolled else run["state"]
    fleet_state.save(state_dir, run)
    return result(fleet, "apply", hosts, run=run["id"], canary=canary, serial=serial, stopped=stopped)


def rollback(fleet: Fleet, state_dir) -> dict:
    """Undo the last fleet apply on every host it reached (and did not already undo)."""
    run = fleet_state.last_open(state_dir)
    journals = {h: inv.check_arg("journal id", j) for h, j in fleet_state.pending(run).items()
                if h in fleet.hosts and inv.check_host_name(h)}
    hosts = rollback_hosts(fleet, journals)
    for h, r in hosts.items():
        run["hosts"][h]["rolled_back"] = r["status"] == OK
        doc = r.get("doc") or {}
        r["steps"] = len(doc.get("data", {}).get("steps", []))
        r["failures"] = doc.get("data", {}).get("failures", [])
    if not fleet_state.pending(run):
        run["state"] = "rolled-back"
    fleet_state.save(state_dir, run)
    return result(fleet, "rollback", hosts, run=run["id"], state=run["state"])

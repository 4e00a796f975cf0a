"""Rolling apply and fleet rollback.

apply: the canary first (apply, proxytune's own verify, then the operator's
--verify-cmd); if that fails, the canary is rolled back and nobody else is
touched. Then the rest in --serial batches; the first host whose apply or
verify fails stops the rollout, and the hosts that failed are rolled back.
Every host is recorded in a fleet run file when its apply starts (with its
journal's high-water mark) and again with its journal entry id when its answer
arrives, so `fleet rollback` can undo what a run reached, even on a host whose
answer never came or was garbage.
"""

from . import fleet_inventory as inv, fleet_play as fp, fleet_state
from proxytune.core.errors import ProxytuneError
from .fleet import FAILED, OK, Fleet, play, result, verify_locally
from .fleet_result import empty, host_result, journal_of, parse_run


def _apply_hosts(fleet: Fleet, run: dict, state_dir, hosts: list[str], serial: int | None) -> dict:
    """Apply on `hosts`. Each host is recorded when its apply starts (with its journal's
    high-water mark, so a host whose answer is garbage can still be rolled back) and again,
    with its journal id, the moment its answer arrives."""
    extra = ("--yes",) + (("--persist",) if fleet.persist else ())
    tasks = [fleet.run_task(["tune", "history", "--json"], (0,), name=fp.MARK_TASK),
             fleet.run_task(fleet.tune_argv("apply", *extra), (0,))]

    def record(ev):
        host, task = ev["host"], ev.get("task")
        if task == fp.MARK_TASK and ev.get("event") == OK:
            run["hosts"][host] = {"journal": None, "status": "started", "mark": fleet_state.high_mark(ev.get("stdout"))}
        elif task == fp.RUN_TASK and ev.get("event") in (OK, FAILED):
            r = parse_run(ev, "apply")
            run["hosts"].setdefault(host, {"journal": None})
            run["hosts"][host].update(journal=journal_of(r["doc"]), status=r["status"], answered=r["doc"] is not None)
        else:
            return
        fleet_state.save(state_dir, run)
    events = play(fleet, hosts, tasks, serial=serial, stop_on_failure=True, on_event=record)
    out = {h: host_result(events[h], fp.RUN_TASK, "apply") for h in hosts}
    for h, r in out.items():
        r["journal"] = journal_of(r.get("doc"))
        r["steps"] = len(r["doc"]["data"]["steps"]) if r.get("doc") else 0
    return out


def rollback_hosts(fleet: Fleet, journals: dict[str, str]) -> dict:
    """Run `tune rollback --id ID` on each host for its own journal entry."""
    if not journals:
        return {}
    journals = {inv.check_host_name(h): inv.check_arg("journal id", j) for h, j in journals.items()}
    argv = ["tune", "rollback", "--yes", "--json", "--id", "{{ proxytune_fleet_journal[inventory_hostname] }}"]
    task = fleet.run_task(argv, (0,), name=fp.ROLLBACK_TASK)
    events = play(fleet, list(journals), [task], extra_vars={"proxytune_fleet_journal": journals})
    return {h: host_result(events[h], fp.ROLLBACK_TASK, "rollback") for h in journals}


def find_unanswered(fleet: Fleet, run: dict, only: list[str]) -> tuple[dict[str, str], dict[str, dict]]:
    """For the hosts of `only` whose apply never gave a usable answer: the journal entry that
    apply made there (the open entry after the mark, with this run's profile), read from their
    journal. A host where there is none is marked done; one whose journal cannot be read is
    returned as a failed host and stays on record."""
    marks = {h: m for h, m in fleet_state.unanswered(run).items() if h in only}
    if not marks:
        return {}, {}
    events = play(fleet, list(marks), [fleet.run_task(["tune", "history", "--json"], (0,), name=fp.MARK_TASK)])
    found, unknown = {}, {}
    for h, mark in marks.items():
        answers = [ev.get("stdout") for ev in events[h] if ev.get("task") == fp.MARK_TASK and ev.get("event") == OK]
        ids = None if mark is None else fleet_state.open_after(answers[-1] if answers else None, mark,
                                                               run.get("host_profile"))
        if ids is None:
            unknown[h] = {**empty(), "status": FAILED, "error": "gave no usable answer and its journal cannot be "
                          "read: see `proxytune tune history` there, then `tune rollback --id ID`"}
        elif ids:
            found[h] = ids[-1]
        else:
            run["hosts"][h]["rolled_back"] = True
    return found, unknown


def apply(fleet: Fleet, state_dir, canary: str | None, serial: int | None, verify_cmd: str | None) -> dict:
    if canary and canary not in fleet.hosts:
        raise ProxytuneError(f"--canary {canary!r} is not among the hosts this run reaches",
                                 f"hosts: {', '.join(fleet.hosts[:10])}")
    run = fleet_state.new_run(state_dir, fleet.profile_ref, fleet.inventory, fleet.hosts, fleet.journal_profile())
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
        hosts.setdefault(h, {**empty(), "error": "rollout stopped before this host", "journal": None})
    undo = {h: hosts[h]["journal"] for h in hosts if hosts[h]["status"] == FAILED and hosts[h].get("journal")}
    undo.update(find_unanswered(fleet, run, [h for h in hosts if hosts[h]["status"] == FAILED])[0])
    rolled = rollback_hosts(fleet, undo)
    for h, r in rolled.items():
        hosts[h]["rolled_back"] = r["status"] == OK
        run["hosts"][h]["rolled_back"] = r["status"] == OK
    run["state"] = "stopped" if stopped else "applied"
    if not fleet_state.pending(run) and not fleet_state.unanswered(run):
        run["state"] = "rolled-back" if rolled else run["state"]
    fleet_state.save(state_dir, run)
    return result(fleet, "apply", hosts, run=run["id"], canary=canary, serial=serial, stopped=stopped)


def rollback(fleet: Fleet, state_dir) -> dict:
    """Undo the last fleet apply on every host it reached (and did not already undo)."""
    run = fleet_state.last_open(state_dir)
    reached = [h for h in fleet.hosts if h in run["hosts"]]
    journals = {h: j for h, j in fleet_state.pending(run).items() if h in reached}
    found, unknown = find_unanswered(fleet, run, reached)
    journals.update(found)
    hosts = {**rollback_hosts(fleet, journals), **unknown}
    for h, r in hosts.items():
        run["hosts"][h]["rolled_back"] = h in journals and r["status"] == OK
        r["steps"] = len(r["doc"]["data"]["steps"]) if r.get("doc") else 0
        r["failures"] = r["doc"]["data"]["failures"] if r.get("doc") else []
    if not fleet_state.pending(run) and not fleet_state.unanswered(run):
        run["state"] = "rolled-back"
    fleet_state.save(state_dir, run)
    return result(fleet, "rollback", hosts, run=run["id"], state=run["state"])

"""`proxytune fleet`: run proxytune itself on every inventory host through
ansible-playbook and put the answers together.

Ansible does the fan-out (ssh, become, forks, serial batches); each host
runs its own `tune check|plan|apply|rollback --json`, so audit, journal and
rollback are the ones a single host uses. The result maps every host to
ok / unreachable / failed (or skipped, when a rollout stopped before it).
"""

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import fleet_inventory as inv, fleet_play as fp
from proxytune.core.errors import ProxytuneError

CALLBACKS = Path(__file__).resolve().parent / "fleet_callback"
OK, UNREACHABLE, FAILED, SKIPPED = "ok", "unreachable", "failed", "skipped"


@dataclass
class Fleet:
    """One fleet command: the inventory, what to run, and a scratch directory."""
    inventory: str
    profile_ref: str
    only: tuple = ()
    skip: tuple = ()
    limit: str | None = None
    forks: int = 5
    persist: bool = False
    progress: object = print
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="proxytune-fleet-")))
    hosts: list = field(default_factory=list)
    tarball: Path | None = None
    digest: str = ""
    shipped_profile: bool = False     # a profile file travels in the bundle

    def env(self) -> dict:
        return {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "proxytune_lines",
                "ANSIBLE_CALLBACK_PLUGINS": os.pathsep.join(
                    p for p in (str(CALLBACKS), os.environ.get("ANSIBLE_CALLBACK_PLUGINS")) if p),
                "ANSIBLE_FORKS": str(self.forks),
                "ANSIBLE_PIPELINING": "True", "ANSIBLE_RETRY_FILES_ENABLED": "False",
                "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(self.workdir / "ansible-tmp")}

    def prepare(self) -> "Fleet":
        if not Path(self.inventory).exists():
            raise ProxytuneError(f"inventory {self.inventory} does not exist")
        inv.check_arg("--profile", self.profile_ref)
        for g in self.only + self.skip:
            inv.check_arg("--only/--skip", g)
        from . import profile as profile_mod
        profile_mod.load(self.profile_ref)          # a bad profile fails here, before any host is touched
        self.hosts = inv.hosts(self.inventory, self.limit, self.env())
        profile_file = Path(self.profile_ref) if Path(self.profile_ref).is_file() else None
        try:
            self.tarball, self.digest = fp.bundle(self.workdir, profile_file)
        except OSError as e:
            raise ProxytuneError(f"cannot build the bundle in {self.workdir}: {e.strerror or e}", "free space in TMPDIR")
        self.shipped_profile = profile_file is not None
        return self

    def tune_argv(self, command: str, *extra: str) -> list[str]:
        argv = ["tune", command, "--json", "-p", fp.profile_arg(self.profile_ref, self.shipped_profile, self.digest)]
        argv += [a for g in self.only for a in ("--only", g)] + [a for g in self.skip for a in ("--skip", g)]
        return argv + list(extra)

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


def play(fleet: Fleet, hosts: list[str], tasks: list[dict], serial: int | None = None,
         stop_on_failure: bool = False, extra_vars: dict | None = None, on_event=None) -> dict[str, list[dict]]:
    """Run one playbook over `hosts`; every host's events, in order.
    `on_event(ev)` sees each as it arrives (so a run can be recorded before Ctrl-C)."""
    book = fleet.workdir / "play.json"
    book.write_text(fp.playbook(fp.ship_tasks(fleet.tarball, fleet.digest) + tasks, serial, stop_on_failure))
    limit = fleet.workdir / "limit.txt"
    limit.write_text("".join(h + "\n" for h in hosts))
    argv = [inv.ansible_binary("ansible-playbook"), "-i", fleet.inventory, "--limit", f"@{limit}", str(book)]
    if extra_vars:
        (fleet.workdir / "vars.json").write_text(json.dumps(extra_vars))
        argv += ["-e", f"@{fleet.workdir / 'vars.json'}"]
    events: dict[str, list[dict]] = {h: [] for h in hosts}
    errors = fleet.workdir / "ansible-stderr.txt"      # a file, not a pipe: 1,000 hosts' warnings never block
    with open(errors, "w") as err_fh, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err_fh, text=True,
                                                        env=fleet.env()) as p:
        for line in p.stdout:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            if ev.get("host") in events:
                events[ev["host"]].append(ev)
                _report_progress(fleet, ev)
                if on_event:
                    on_event(ev)
    err = errors.read_text(errors="replace")
    if p.returncode in (1, 4, 5, 250) and not any(events.values()):
        last = (err.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        raise ProxytuneError(f"ansible-playbook failed: {last}", "try the inventory by hand: ansible all -i INVENTORY -m ping")
    return events


def _report_progress(fleet: Fleet, ev: dict) -> None:
    if ev["event"] == UNREACHABLE:
        fleet.progress(f"{ev['host']}: unreachable: {_first_line(ev.get('msg'))}")
    elif ev["event"] == FAILED:
        fleet.progress(f"{ev['host']}: {ev['task']} failed: {_first_line(ev.get('stderr') or ev.get('msg'))}")
    elif ev["event"] == OK and ev["task"] in fp.RESULT_TASKS:
        fleet.progress(f"{ev['host']}: {ev['task']} done (exit {ev.get('rc')})")


def _first_line(text) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[-1][:200] if lines else ""


def host_result(events: list[dict], task: str = fp.RUN_TASK) -> dict:
    """One host's status and its proxytune JSON, from its Ansible events."""
    out = {"status": SKIPPED, "fingerprint": None, "settings": [], "summary": {}, "exit": None, "error": "",
           "doc": None}
    for ev in events:
        if ev["event"] == UNREACHABLE:
            return {**out, "status": UNREACHABLE, "error": _first_line(ev.get("msg"))}
        if ev["event"] == FAILED and ev["task"] != task:
            return {**out, "status": FAILED, "error": f"{ev['task']}: {_first_line(ev.get('stderr') or ev.get('msg'))}"}
        if ev["task"] == task and ev["event"] in (OK, FAILED):
            out.update(_parse_run(ev))
    return out


def _parse_run(ev: dict) -> dict:
    try:
        doc = json.loads(ev.get("stdout") or "")
    except json.JSONDecodeError:
        doc = None
    status = OK if ev["event"] == OK and isinstance(doc, dict) else FAILED
    error = "" if status == OK else _first_line(ev.get("stderr") or ev.get("msg"))
    if ev["event"] == FAILED and isinstance(doc, dict) and not error:
        error = f"exit {ev.get('rc')}"
    rows = _settings_of(doc) if isinstance(doc, dict) else {}
    return {"status": status, "exit": ev.get("rc"), "error": error, "doc": doc,
            "fingerprint": doc.get("host") if isinstance(doc, dict) else None, **rows}


def _settings_of(doc: dict) -> dict:
    data = doc.get("data", {})
    audit = data.get("verify", data) if isinstance(data, dict) else {}
    if not isinstance(audit, dict) or "settings" not in audit:
        return {}
    return {"settings": audit["settings"], "summary": audit.get("summary", {})}


def exit_code(hosts: dict) -> int:
    """2 when a host was unreachable, failed, not reached or could not read a
    setting; 1 drift somewhere; else 0 (the codes `tune check` uses, fleet-wide)."""
    if any(h["status"] != OK or h["summary"].get("error") or h.get("exit") == 2 for h in hosts.values()):
        return 2
    return 1 if any(h["summary"].get("drift") or h.get("exit") == 1 for h in hosts.values()) else 0


def result(fleet: Fleet, action: str, hosts: dict, **extra) -> dict:
    for h in hosts.values():
        h.pop("doc", None)
    counts = {st: sum(1 for h in hosts.values() if h["status"] == st) for st in (OK, UNREACHABLE, FAILED, SKIPPED)}
    return {"fleet": action, "inventory": str(fleet.inventory), "profile": fleet.profile_ref,
            "limit": fleet.limit, "only": list(fleet.only), "skip": list(fleet.skip), "forks": fleet.forks,
            "hosts": hosts, "summary": counts, "exit": exit_code(hosts), **extra}


def run_simple(fleet: Fleet, action: str) -> dict:
    """check / plan / doctor: one play over every host, nothing changed."""
    if action == "doctor":
        tasks = [fp.run_task(["probe", "caps", "--json"], fleet.digest, (0, 1))]
    else:       # exit 2 with a result: a setting could not be read there; shown as ERROR, not a failed host
        extra = ("--persist",) if action == "plan" and fleet.persist else ()
        tasks = [fp.run_task(fleet.tune_argv(action, *extra), fleet.digest, (0, 1, 2))]
    events = play(fleet, fleet.hosts, tasks)
    hosts = {h: host_result(events[h]) for h in fleet.hosts}
    if action == "doctor":
        for h in hosts.values():
            h["capabilities"] = _caps_summary(h.pop("doc", None))
    return result(fleet, action, hosts)


def _caps_summary(doc) -> dict:
    data = doc.get("data") if isinstance(doc, dict) else None      # `probe caps --json`: the result envelope
    caps = data.get("capabilities", {}) if isinstance(data, dict) else {}
    return {k: bool(v.get("ok")) for k, v in caps.items() if isinstance(v, dict)}


def verify_locally(command: str | None, host: str, progress) -> tuple[bool, str]:
    """The operator's own check of the canary (e.g. a load test), run here
    without a shell; the host name arrives as $PROXYTUNE_FLEET_HOST."""
    if not command:
        return True, ""
    argv = shlex.split(command)
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=1800,
                           env={**os.environ, "PROXYTUNE_FLEET_HOST": host})
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"--verify-cmd could not run: {e}"
    progress(f"{host}: --verify-cmd exit {r.returncode}")
    return r.returncode == 0, "" if r.returncode == 0 else f"--verify-cmd exit {r.returncode}: {_first_line(r.stderr or r.stdout)}"

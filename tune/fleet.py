"""`proxytune fleet`: run proxytune itself on every inventory host through
ansible-playbook and put the answers together.

Ansible does the fan-out (ssh, become, forks, serial batches); each host
runs its own `tune check|plan|apply|rollback --json`, so audit, journal and
rollback are the ones a single host uses. The result maps every host to
ok / unreachable / failed (or skipped, when a rollout stopped before it).
"""

import json
import os
import secrets
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import fleet_inventory as inv, fleet_play as fp
from .fleet_result import FAILED, OK, SKIPPED, UNREACHABLE, first_line, host_result
from proxytune.core import procgroup
from proxytune.core.errors import ProxytuneError
from proxytune.core.rundir import RunDir

CALLBACKS = Path(__file__).resolve().parent / "fleet_callback"
DEFAULT_TIMEOUT = 900
KIND = {"check": "audit", "plan": "plan", "apply": "apply", "doctor": "caps"}


@dataclass
class Fleet:
    """One fleet command: the inventory, what to run, and a private scratch directory
    (`with Fleet(...) as f:` removes it on every way out, SIGTERM and SIGHUP included)."""
    inventory: str
    profile_ref: str
    only: tuple = ()
    skip: tuple = ()
    limit: str | None = None
    forks: int = 5
    persist: bool = False
    progress: object = print
    timeout: int = DEFAULT_TIMEOUT       # seconds per host and task
    install: bool = True                 # apt-get the Debian dependencies a host lacks
    workdir: Path | None = None
    hosts: list = field(default_factory=list)
    tarball: Path | None = None
    sha: str = ""
    bundle_id: str = ""                  # the tarball digest + a token only this run uses
    shipped_profile: bool = False        # a profile file travels in the bundle
    _rundir: RunDir | None = None

    def __enter__(self) -> "Fleet":
        self._rundir = RunDir("fleet").__enter__()
        self.workdir = self._rundir.path
        return self

    def __exit__(self, *exc):
        return self._rundir.__exit__(*exc)

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
        if not (CALLBACKS / "proxytune_lines.py").is_file():
            raise ProxytuneError(f"the Ansible callback plugin is missing from {CALLBACKS}",
                                 "reinstall proxytune: the package is incomplete")
        inv.check_arg("--profile", self.profile_ref)
        for g in self.only + self.skip:
            inv.check_arg("--only/--skip", g)
        from . import profile as profile_mod
        prof = profile_mod.load(self.profile_ref)   # a bad profile fails here, before any host is touched
        self.hosts = inv.hosts(self.inventory, self.limit, self.env())
        profile_file = self._travelling(prof)
        try:
            self.tarball, self.sha = fp.bundle(self.workdir, profile_file)
        except OSError as e:
            raise ProxytuneError(f"cannot build the bundle in {self.workdir}: {e.strerror or e}", "free space in TMPDIR")
        self.bundle_id = f"{self.sha[:16]}-{secrets.token_hex(6)}"
        self.shipped_profile = profile_file is not None
        return self

    def _travelling(self, prof) -> Path | None:
        """The profile every host gets as this controller resolved it: a file, or a name that is a site or
        user profile here, travels flattened (includes merged, waivers kept: each host would look a name up
        again and find its shipped namesake); a shipped name travels as the name (the bundle ships it)."""
        from . import profile as profile_mod, profileflat
        shipped = prof.path.resolve().is_relative_to(profile_mod.PROFILES_DIR.resolve())
        if shipped and not profile_mod.profilefiles.is_path(self.profile_ref):
            return None
        flat = self.workdir / "profile.toml"
        flat.write_text(profileflat.flatten(prof))
        again = profile_mod.load(str(flat))
        if _shape(again) != _shape(prof) or again.params != prof.params:
            raise ProxytuneError(f"--profile {self.profile_ref}: cannot send it to the hosts as resolved here "
                                 "(its flattened copy loads differently)", "send it as a file: -p PATH.toml")
        return flat

    def host_profile(self) -> str:
        """The --profile each host sees (a file: its copy in this run's bundle)."""
        return fp.profile_arg(self.profile_ref, self.shipped_profile, self.bundle_id)

    def journal_profile(self) -> str:
        """What each host's journal records as this run's profile: the name, or (a file)
        the tail of its bundled copy's path, unique to this run."""
        return self.host_profile().split("}}", 1)[-1]

    def tune_argv(self, command: str, *extra: str) -> list[str]:
        argv = ["tune", command, "--json", "-p", self.host_profile()]
        argv += [a for g in self.only for a in ("--only", g)] + [a for g in self.skip for a in ("--skip", g)]
        return argv + list(extra)

    def run_task(self, argv: list[str], ok_codes: tuple[int, ...], name: str = fp.RUN_TASK) -> dict:
        return fp.run_task(argv, self.bundle_id, self.sha, ok_codes, self.timeout, name)


def _shape(prof) -> list:
    return [(r.backend, r.key, r.mode, r.wanted, r.reason, r.source, r.waive, r.critical) for r in prof.raw]


def play(fleet: Fleet, hosts: list[str], tasks: list[dict], serial: int | None = None,
         stop_on_failure: bool = False, extra_vars: dict | None = None, on_event=None) -> dict[str, list[dict]]:
    """Run one playbook over `hosts`; every host's events, in order.
    `on_event(ev)` sees each as it arrives (so a run can be recorded before Ctrl-C)."""
    book = fleet.workdir / "play.json"
    tasks = fp.with_dependencies(tasks[0], fleet.install) + tasks[1:]
    book.write_text(fp.playbook(tasks, fleet.tarball, fleet.timeout, serial, stop_on_failure))
    fp.library(fleet.workdir)
    limit = fleet.workdir / "limit.txt"
    limit.write_text("".join(inv.check_host_name(h) + "\n" for h in hosts))
    argv = [inv.ansible_binary("ansible-playbook"), "-i", fleet.inventory, "--limit", f"@{limit}", str(book)]
    if extra_vars:
        (fleet.workdir / "vars.json").write_text(json.dumps(extra_vars))
        argv += ["-e", f"@{fleet.workdir / 'vars.json'}"]
    events: dict[str, list[dict]] = {h: [] for h in hosts}
    errors = fleet.workdir / "ansible-stderr.txt"      # a file, not a pipe: 1,000 hosts' warnings never block
    with open(errors, "w") as err_fh, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err_fh, text=True,
                                                        env=fleet.env(), start_new_session=True) as p:
        try:
            for line in p.stdout:
                _take(fleet, events, line, on_event)
        except BaseException:            # Ctrl-C, SIGTERM, SIGHUP: ansible-playbook stops too
            procgroup.stop(p, grace=20)
            raise
    err = errors.read_text(errors="replace")
    if p.returncode in (1, 4, 5, 250) and not any(events.values()):
        last = (err.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        raise ProxytuneError(f"ansible-playbook failed: {last}", "try the inventory by hand: ansible all -i INVENTORY -m ping")
    return events


def _take(fleet: Fleet, events: dict, line: str, on_event) -> None:
    """One callback line: kept for its host (a line naming no host of ours is dropped)."""
    try:
        ev = json.loads(line)
    except json.JSONDecodeError:
        return
    if not isinstance(ev, dict) or not isinstance(ev.get("host"), str) or ev["host"] not in events:
        return
    events[ev["host"]].append(ev)
    _report_progress(fleet, ev)
    if on_event:
        on_event(ev)


def _report_progress(fleet: Fleet, ev: dict) -> None:
    if ev.get("event") == UNREACHABLE:
        fleet.progress(f"{ev['host']}: unreachable: {first_line(ev.get('msg'))}")
    elif ev.get("event") == FAILED:
        fleet.progress(f"{ev['host']}: {ev.get('task')} failed: {first_line(ev.get('stderr') or ev.get('msg'))}")
    elif ev.get("event") == OK and ev.get("task") in fp.RESULT_TASKS:
        fleet.progress(f"{ev['host']}: {ev['task']} done (exit {ev.get('rc')})")


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
        tasks = [fleet.run_task(["probe", "caps", "--json"], (0, 1))]
    else:       # exit 2 with a result: a setting could not be read there; shown as ERROR, not a failed host
        extra = ("--persist",) if action == "plan" and fleet.persist else ()
        tasks = [fleet.run_task(fleet.tune_argv(action, *extra), (0, 1, 2))]
    events = play(fleet, fleet.hosts, tasks)
    hosts = {h: host_result(events[h], fp.RUN_TASK, KIND[action]) for h in fleet.hosts}
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
    return r.returncode == 0, "" if r.returncode == 0 else f"--verify-cmd exit {r.returncode}: {first_line(r.stderr or r.stdout)}"

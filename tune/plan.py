"""plan(host): read every selected setting and decide what apply would do.

Pure reading: nothing here changes the host, so `tune check` and
`tune plan` are always safe to run.
"""

from fnmatch import fnmatchcase

from . import backends, modes, params as params_mod, profile as profile_mod
from proxytune.core.errors import BackendError, NotApplicable, ProxytuneError
from proxytune.core.invocation import command
from .host import Host
from .model import DRIFT, ERROR, MET, NOT_APPLICABLE, WAIVED, Change, Plan, Setting


def select(settings: list[Setting], only: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> list[Setting]:
    """Settings matching any --only glob (all when none) and no --skip glob."""
    chosen = [s for s in settings if not only or any(fnmatchcase(s.address, g) for g in only)]
    chosen = [s for s in chosen if not any(fnmatchcase(s.address, g) for g in skip)]
    if not chosen:
        raise ProxytuneError(f"--only/--skip {' '.join(only + skip)} leave no setting of this profile",
                             f"see {command('profiles show NAME')} for the addresses")
    for opt, globs in (("--only", only), ("--skip", skip)):
        for g in globs:          # a mistyped --skip would otherwise apply what the operator meant to leave out
            if not any(fnmatchcase(s.address, g) for s in settings):
                raise ProxytuneError(f"{opt} '{g}' matches no setting of this profile; nothing was changed",
                                     f"see {command('profiles show NAME')} for the addresses")
    return chosen


def build(ref: str, host: Host, cli_params: dict, only: tuple[str, ...] = (),
          skip: tuple[str, ...] = ()) -> Plan:
    """Load the profile, fill in parameters, read the host, decide each change."""
    prof = profile_mod.load(ref, root=host.root)
    detected: list[str] = []
    values, sources = params_mod.resolve(host, cli_params, prof.params, detected)
    settings, notes = profile_mod.expand(prof, values, host)
    plan = Plan(profile=ref, os=prof.os, params={"values": values, "sources": sources},
                notes=params_mod.choice_notes(values, sources) + detected + notes)
    if prof.os != host.os:
        plan.notes.append(f"profile is for {prof.os}, this host runs {host.os}: "
                          "check and apply will not find its knobs here; use `tune export`")
    for s in select(settings, only, skip):
        plan.changes.append(evaluate(s, prof.os, host))
    return plan


def evaluate(s: Setting, os_name: str, host: Host) -> Change:
    backend = backends.get(os_name, s.backend, host)
    change = _measured(s, backend)
    change.seen = "; ".join(backend.notes)      # what reading found worth saying (the processes it left out)
    return change


def _measured(s: Setting, backend) -> Change:
    """A waived setting is waived whatever the host says (one it cannot read never blocks an apply)."""
    try:
        current = backend.read(s.key)
    except NotApplicable as e:
        return _waived(s, None) if s.waive else Change(s, status=NOT_APPLICABLE, note=str(e))
    except (BackendError, OSError) as e:
        return _waived(s, None) if s.waive else Change(s, status=ERROR, note=getattr(e, "message", str(e)))
    if s.waive:         # shown as it is, never drift, never applied
        return _waived(s, current)
    try:
        ok = current is not None and modes.satisfied(s.mode, current, s.wanted)
        target = None if ok else modes.target(s.mode, current, s.wanted)
    except ValueError as e:
        return Change(s, current=current, status=ERROR, note=str(e))
    change = Change(s, current=current, target=target, status=MET if ok else DRIFT)
    try:
        change = backend.at_boot(change)
    except (BackendError, OSError) as e:
        return Change(s, current=current, status=ERROR, note=getattr(e, "message", str(e)))
    if change.needed:
        change.note = backend.obstacle(change) or ""
    return change


def _waived(s: Setting, current) -> Change:
    return Change(s, current=current, status=WAIVED, note=f"waived: {s.waive}")


def refuse_errors(plan: Plan) -> None:
    """apply changes nothing while a selected setting is in error (a host file it cannot parse)."""
    errors = [c for c in plan.changes if c.status == ERROR]
    if errors:
        address = errors[0].setting.address
        raise ProxytuneError(f"{address}: {errors[0].note}",
                             f"fix it, or leave it out with --skip '{address}'; nothing was changed")


def boot_warnings(plan: Plan, persist: bool = True) -> list[str]:
    """What apply cannot make stick: settings a file read after ours undoes at boot. Without --persist
    only those whose file is the change itself (a systemd drop-in behind the admin's override.conf)."""
    def concerned(c) -> bool:
        return persist or not backends.REGISTRY[(plan.os, c.setting.backend)].runtime
    return [f"{c.setting.address}: {c.boot}; edit that file: what apply writes cannot win over it"
            for c in plan.changes if c.boot and concerned(c)]

"""The host audit: a profile's plan on this host plus what the running proxy
shows (observe.py). Built here, once, for `tune check`, `report` and `doctor`;
its section (tables and notes) is built here too, for the terminal and the
report alike."""

from dataclasses import dataclass
from fnmatch import fnmatchcase

from proxytune.core import monitoring
from proxytune.core.sections import Section, Table

from . import observe, plan as plan_mod
from .host import Host
from .model import Plan
from .values import parse, render


@dataclass
class Audit:
    plan: Plan
    observations: dict

    def to_json(self) -> dict:
        return {**self.plan.to_json(), "observations": self.observations}

    def exit_code(self) -> int:
        """0 all met, 1 drift or a warning from the running proxy, 2 an error in the plan."""
        return max(self.plan.exit_code(), 1 if observe.warnings(self.observations) else 0)

    def drift(self) -> list[dict]:
        return [{k: s[k] for k in ("setting", "current", "wanted", "reason")}
                for s in self.plan.to_json()["settings"] if s["status"] == "drift"]


def build(host: Host, profile_ref: str, params: dict | None = None, only=(), skip=()) -> Audit:
    plan = plan_mod.build(profile_ref, host, params or {}, only, skip)
    values = plan.params["values"]
    somaxconn = next((c.current for c in plan.changes if c.setting.address == "sysctl:net.core.somaxconn"), None)
    obs = observe.observe(values["service"], values["cache_dirs"], somaxconn if isinstance(somaxconn, int) else None,
                          host.live)
    return Audit(plan, obs)


def settings_table(doc: dict, title: str = "Settings", show_target: bool = False) -> Table:
    """Every setting of a plan's JSON: current, wanted, (what apply will set), status, why."""
    headers = ["setting", "current", "wanted"] + (["will set"] if show_target else []) + ["status", "reason / note"]
    rows = []
    for s in doc["settings"]:
        target = [render(parse(s["target"])) if s["target"] is not None else ""] if show_target else []
        rows.append([s["setting"], s["current_text"], s["wanted_text"], *target, s["status"], s["note"] or s["reason"]])
    return Table(title, headers, rows, status_col=len(headers) - 2)


def observation_tables(obs: dict) -> tuple[list[Table], list[str]]:
    """(tables, notes) of what the running proxy shows."""
    tables, notes = [], []
    if obs["processes"]:
        tables.append(Table(f"Running {obs['service']} processes",
                            ["pid", "nofile soft", "nofile hard", "fds open", "status", "note"],
                            [[p["pid"], p["nofile_soft"], p["nofile_hard"], p["fds_open"], p["status"], p["note"]]
                             for p in obs["processes"]], status_col=4))
    else:
        notes.append(f"no running {obs['service']} process to inspect")
    if obs["listeners"]:
        tables.append(Table("Listen sockets", ["address", "queued", "backlog", "status", "note"],
                            [[l["local"], l["queued"], l["backlog"], l["status"], l["note"]]
                             for l in obs["listeners"]], status_col=3))
    if obs["cache_dirs"]:
        tables.append(Table("Cache directories", ["path", "mount", "atime", "status", "note"],
                            [[d["path"], d.get("mountpoint", "-"), d.get("atime", "-"), d["status"], d["note"]]
                             for d in obs["cache_dirs"]], status_col=3))
    return tables, notes


def summary_line(doc: dict) -> str:
    s = doc["summary"]
    waived = f", {s['waived']} waived" if s.get("waived") else ""
    return f"{s['met']} met, {s['drift']} drift, {s['n/a']} not applicable, {s['error']} error{waived}"


def section(doc: dict, settings_title: str = "Settings") -> Section:
    """An audit's JSON as one section: the settings, then the running proxy, then the plan's notes."""
    sec = Section(f"Host audit: profile {doc['profile']}", summary_line(doc) + ".")
    sec.tables.append(settings_table(doc, settings_title))
    tables, notes = observation_tables(doc["observations"])
    sec.tables += tables
    sec.notes += notes + doc.get("notes", [])
    return sec


def is_critical(setting: dict, patterns=()) -> bool:
    """Drift of this setting is CRITICAL for monitoring: the profile says so (`critical = true`)
    or the setting matches a --critical pattern."""
    return bool(setting.get("critical")) or any(fnmatchcase(setting["setting"], p) for p in patterns)


def _named(settings: list[str], most: int = 5) -> str:
    more = f", +{len(settings) - most} more" if len(settings) > most else ""
    return f" ({', '.join(settings[:most])}{more})" if settings else ""


def nagios(doc: dict, critical=()) -> tuple[int, str]:
    """(state, plugin line) of an audit: CRITICAL for a critical drift, UNKNOWN when a setting could
    not be read, WARNING for any other drift or a warning from the running proxy, else OK."""
    s = doc["summary"]
    drift = [x for x in doc["settings"] if x["status"] == "drift"]
    crit = [x["setting"] for x in drift if is_critical(x, critical)]
    errors = [x["setting"] for x in doc["settings"] if x["status"] == "error"]
    warns = observe.warnings(doc["observations"])
    state = (monitoring.CRITICAL if crit else monitoring.UNKNOWN if errors else
             monitoring.WARNING if drift or warns else monitoring.OK)
    parts = [f"{len(crit)} critical drift{_named(crit)}"] if crit else []
    other = [x["setting"] for x in drift if x["setting"] not in crit]
    parts += [f"{len(other)} {'other ' if crit else ''}drift{_named(other)}",
              f"{s['met']} met", f"{s['n/a']} n/a"]
    parts += [f"{len(errors)} unreadable{_named(errors)}"] if errors else []
    parts += [f"{s['waived']} waived"] if s.get("waived") else []
    parts += [f"{warns} warning(s) from the running {doc['observations']['service']}"] if warns else []
    total = len(doc["settings"])
    perfdata = [monitoring.perf("met", s["met"], high=total), monitoring.perf("drift", s["drift"], "0", high=total),
                monitoring.perf("critical", len(crit), crit="0", high=total),
                monitoring.perf("na", s["n/a"], high=total), monitoring.perf("error", s["error"], high=total),
                monitoring.perf("waived", s.get("waived", 0), high=total), monitoring.perf("proxy_warnings", warns)]
    return state, monitoring.plugin_line(state, f"profile {doc['profile']}: " + ", ".join(parts), perfdata)


def prometheus(doc: dict) -> str:
    """An audit as a node_exporter textfile: each applicable setting met (1) or not (0), counts by
    status, the running proxy's warnings, and when this ran. A n/a setting has no sample (it does
    not apply here; it is counted under status "n/a"); a waived one is a series of its own, so an
    alert on `proxytune_setting_met == 0` never fires for what the profile leaves alone on purpose."""
    m = monitoring.Metrics()
    profile = doc["profile"]
    m.declare("proxytune_setting_met", "1 when the setting meets the profile, 0 on drift or when it "
              "could not be read (n/a and waived settings have no sample here).")
    m.declare("proxytune_setting_waived", "1 for each setting the profile waives (checked, never applied).")
    for s in doc["settings"]:
        labels = {"setting": s["setting"], "profile": profile}
        if s["status"] == "waived":
            m.add("proxytune_setting_waived", "", labels, 1)
        elif s["status"] != "n/a":
            m.add("proxytune_setting_met", "", labels, int(s["status"] == "met"))
    for status, n in doc["summary"].items():
        m.add("proxytune_settings", "Settings of the profile by status.", {"profile": profile, "status": status}, n)
    m.add("proxytune_proxy_warnings", "Warnings from the running proxy (fd use, listen backlogs, cache-dir atime).",
          {"profile": profile, "service": doc["observations"]["service"]}, observe.warnings(doc["observations"]))
    monitoring.last_run(m, "check", profile)
    return m.text()

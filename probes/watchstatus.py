"""`watch status`: the last minutes of the recorder, summed up for an operator or a Nagios check.

A check run by Nagios or Icinga every few minutes asks "was the proxy limited
lately?", which one doctor window cannot answer and the watcher's recorder can:
the windows that ended in the last N minutes, each finding seen in them (how
many windows, its worst severity), and the windows the proxy was absent or the
doctor failed. States as `doctor --format nagios` gives them (render.doctor_nagios):
CRITICAL for a high-severity finding or one --critical names, WARNING for any
other finding or an absent proxy, OK when every window was clean; UNKNOWN when
no window ended in the span (the watcher is not running) or every one failed.
"""

from proxytune.core import monitoring

from . import render, windows


def summarise(records: list[dict], since: float, until: float) -> dict:
    """The windows (heads) that ended in [since, until]: counts by status and each finding seen."""
    recent = [r for r in records if windows.is_window(r) and since <= r["t1"] <= until]
    status = {s: sum(1 for r in recent if r.get("status") == s) for s in (windows.WATCHED, windows.ABSENT, windows.FAILED)}
    seen: dict[str, dict] = {}
    rank = {"high": 3, "medium": 2, "low": 1}
    for r in recent:
        for f in r["findings"]:
            if not isinstance(f, dict) or "id" not in f:
                continue
            s = seen.setdefault(f["id"], {"id": f["id"], "severity": f.get("severity", "low"), "windows": 0,
                                          "title": f.get("title", ""), "last": r["t1"]})
            s["windows"] += 1
            s["last"] = max(s["last"], r["t1"])
            if rank.get(f.get("severity"), 0) > rank.get(s["severity"], 0):
                s["severity"], s["title"] = f["severity"], f.get("title", "")
    found = sorted(seen.values(), key=lambda s: (-rank.get(s["severity"], 0), -s["windows"], s["id"]))
    reasons = sorted({r.get("reason", "") for r in recent if r.get("status") == windows.FAILED} - {""})
    return {"since": since, "until": until, "windows": len(recent), "by_status": status, "findings": found,
            "failed_reasons": reasons[:3]}


def nagios(s: dict, minutes: float, critical=()) -> tuple[int, str]:
    """(state, plugin line) for the summary of the last `minutes`."""
    st = s["by_status"]
    span = f"the last {minutes:g} min"
    if not s["windows"]:
        return monitoring.UNKNOWN, monitoring.plugin_line(
            monitoring.UNKNOWN, f"no watch window ended in {span}: is proxytune-watch running?")
    perfdata = [monitoring.perf("windows", s["windows"]), monitoring.perf("watched", st["watched"]),
                monitoring.perf("absent", st["absent"], "0"), monitoring.perf("failed", st["failed"]),
                monitoring.perf("findings", len(s["findings"]), "0")]
    if st["failed"] == s["windows"]:
        why = "; ".join(s["failed_reasons"]) or "no reason recorded"
        return monitoring.UNKNOWN, monitoring.plugin_line(monitoring.UNKNOWN, f"every window of {span} failed: {why}",
                                                          perfdata)
    crit = [f for f in s["findings"] if render.doctor_critical(f, critical)]
    state = (monitoring.CRITICAL if crit else
             monitoring.WARNING if s["findings"] or st["absent"] else monitoring.OK)
    parts = [f"{f['severity']} {f['id']} ({f['windows']} of {s['windows']} windows)" for f in s["findings"]]
    if st["absent"]:
        parts.append(f"the proxy was absent in {st['absent']} of {s['windows']} windows")
    text = f"watch, {span}: " + ("; ".join(parts) if parts else f"no findings in {s['windows']} windows")
    return state, monitoring.plugin_line(state, text, perfdata)

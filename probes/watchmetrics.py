"""The watcher's metrics, as a Prometheus scrape or node_exporter's textfile collector reads them.

From the last window: the findings active now (by id and severity), each cap
and limit as used and limit, the time budget's parts. From the run: windows
by status, episodes started, windows the recorder could not keep, and the
watcher's own CPU (its process and its tracers: bpftrace and perf are its
children, and their CPU is what watching costs). The format's rules are
core/monitoring's, shared with `tune check` and `doctor`.
"""

import os

from proxytune.core import monitoring, procfs


def watcher_cpu_seconds() -> float:
    """CPU seconds of this process, its live descendants (the standing bpftrace, a window's perf)
    and the children it has reaped (each closed session's tracers)."""
    t = os.times()
    live = sum(procfs.cpu_seconds(p) or 0.0 for p in procfs.descendants(os.getpid()))
    return t.user + t.system + t.children_user + t.children_system + live


def text(last: dict | None, run: dict) -> str:
    """The metrics after a window. `last` is its record (windows.watched/unwatched); `run` the loop's
    counts: windows {status: n}, episodes (started), dropped (windows not stored), cpu_s."""
    m = monitoring.Metrics()
    m.declare("proxytune_watch_findings", "Findings active in the last window, by id and severity (1 each).")
    m.declare("proxytune_watch_cap_used", "Each cap or limit of the proxy in the last window: what it used.")
    m.declare("proxytune_watch_cap_limit", "Each cap or limit of the proxy in the last window: its limit.")
    m.declare("proxytune_watch_request_seconds", "Time an average request spent in each part of its budget in "
                                                 "the last window (parts not measurable there are left out).")
    if last is not None:
        _window(m, last)
    for status, n in sorted((run.get("windows") or {}).items()):
        m.add("proxytune_watch_windows_total", "Windows since the watch started, by what happened.",
              {"status": status}, n, kind="counter")
    m.add("proxytune_watch_episodes_total", "Episodes started since the watch started.", {}, run.get("episodes", 0),
          kind="counter")
    m.add("proxytune_watch_windows_dropped_total", "Windows the recorder could not store (e.g. a full disk).",
          {}, run.get("dropped", 0), kind="counter")
    m.add("proxytune_watch_cpu_seconds_total", "CPU the watcher used since it started, its tracers included.",
          {}, f"{run.get('cpu_s', 0.0):.3f}", kind="counter")
    if last is not None:
        m.add("proxytune_watch_last_window_end_timestamp_seconds", "When the last window ended (Unix time).",
              {}, f"{last['t1']:.3f}")
    return m.text()


def _caps(rows: list[dict]) -> dict[str, dict]:
    """Each cap by its stable key (no pid or tid in a label: each would be a new series), the row
    nearest its limit where several share one (every worker's fds)."""
    out: dict[str, dict] = {}
    for row in rows:
        used, limit = row.get("used"), row.get("limit")
        if isinstance(used, (int, float)) and isinstance(limit, (int, float)) and limit > 0:
            key = str(row.get("key") or row.get("what"))
            if key not in out or used / limit > out[key]["used"] / out[key]["limit"]:
                out[key] = row
    return out


def _window(m: monitoring.Metrics, rec: dict) -> None:
    counts: dict[tuple[str, str], int] = {}
    for f in rec.get("findings") or []:
        key = (f.get("id", "?"), f.get("severity", "?"))
        counts[key] = counts.get(key, 0) + 1
    for (fid, sev), n in counts.items():
        m.add("proxytune_watch_findings", "", {"id": fid, "severity": sev}, n)
    body = rec.get("body") or {}
    for cap, row in _caps(body.get("headroom") or []).items():
        m.add("proxytune_watch_cap_used", "", {"cap": cap}, row["used"])
        m.add("proxytune_watch_cap_limit", "", {"cap": cap}, row["limit"])
    for part, p in ((body.get("budget") or {}).get("parts") or {}).items():
        if p.get("measurable") and p.get("ms") is not None:
            m.add("proxytune_watch_request_seconds", "", {"part": part}, round(p["ms"] / 1000, 6))

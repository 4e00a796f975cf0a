"""One watch window as the recorder keeps it, and back to what the doctor's renderer reads.

A window record's head holds what episodes are folded from (run, seq, times,
status, proxy, findings); its body (stored compressed, decoded only when
asked) the rest of the doctor's answer (target, verdict, headroom) and the
part of its evidence the doctor's report prints (compact: no bpftrace maps,
perf samples or per-connection lists), so that `watch history` reads heads
only and `watch show` prints the worst window of an episode exactly as
`doctor` printed it live, time budget included (the answer's `budget`, from
probes/budget.py; a record without one keeps null, never an invented one).
"""

import time

VERSION = 1
WATCHED, ABSENT, FAILED = "watched", "absent", "failed"
# The evidence keys doctor_report, doctor_nagios and the JSON readers use; the rest stays out.
KEPT_EVIDENCE = ("pids", "comm", "scripts", "skipped_scripts", "proxy", "kernel", "loop", "window_s",
                 "exited", "all_exited", "cpu_cores", "procs", "listeners")


def compact(ev: dict) -> dict:
    """The evidence the report of one window needs, bounded in size."""
    out = {k: ev[k] for k in KEPT_EVIDENCE if k in ev}
    perf = ev.get("perf") or {}
    out["perf"] = {k: perf[k] for k in ("available", "reason", "split") if k in perf}
    triage = ev.get("triage") or {}
    out["triage"] = {"need": triage.get("need") or {}}
    audit = ev.get("audit") or {}
    out["audit"] = {k: audit[k] for k in ("available", "reason", "profile", "summary", "drift") if k in audit}
    return out


def watched(run: str, seq: int, t0: float, t1: float, result: dict, proxy: str | None) -> dict:
    """The record of a window the doctor watched: a head that episodes are folded from (times,
    findings) and, as its body (read only for `watch show`), the rest of the answer, compacted."""
    ev = result["evidence"]
    return {"v": VERSION, "run": run, "seq": seq, "t0": round(t0, 3), "t1": round(t1, 3), "status": WATCHED,
            "proxy": proxy, "comm": result["target"].get("comm"), "findings": result["findings"],
            "body": {"target": result["target"], "window_s": result["window_s"], "verdict": result["verdict"],
                     "headroom": result["headroom"], "budget": result.get("budget"), "evidence": compact(ev)}}


def unwatched(run: str, seq: int, t0: float, t1: float, status: str, reason: str, proxy: str | None) -> dict:
    """The record of a window with no answer: the proxy absent, or the doctor failed (and why)."""
    return {"v": VERSION, "run": run, "seq": seq, "t0": round(t0, 3), "t1": round(t1, 3), "status": status,
            "proxy": proxy, "reason": reason, "findings": []}


def as_result(record: dict) -> dict:
    """A watched window's whole record as diagnose() returned it, for the doctor's renderers."""
    b = record["body"]
    return {"target": b["target"], "window_s": b["window_s"], "findings": record["findings"],
            "verdict": b["verdict"], "headroom": b.get("headroom") or [], "budget": b.get("budget"),
            "evidence": {**b["evidence"], "budget": b.get("budget")}}


def is_window(record: dict) -> bool:
    """A record this version can use (read as untrusted: a ring may hold older or damaged ones)."""
    return (isinstance(record, dict) and record.get("v") == VERSION and isinstance(record.get("run"), str)
            and isinstance(record.get("seq"), int) and _time(record.get("t0")) and _time(record.get("t1"))
            and isinstance(record.get("findings"), list)
            and all(isinstance(f, dict) and isinstance(f.get("id"), str) and isinstance(f.get("severity"), str)
                    for f in record["findings"]))


def _time(t) -> bool:
    """A Unix time gmtime() can render: finite, from 1970 to the year 9999."""
    return isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < 253402300800


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

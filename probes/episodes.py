"""Episodes: consecutive windows with one finding, folded into one event.

Pure functions over window records (probes/windows.py), oldest first. Two
windows are consecutive when one watcher run wrote them one after the other
(same run, seq + 1): a window without the finding, a window the proxy was
absent for, a restart of the watcher or a window lost to a full disk ends an
episode. The worst window is the one where the finding was most severe, then
had the most impact (the doctor's own ranking); its evidence is the peak.
"""

import re
import time

from .findings import SEVERITY_RANK
from .windows import is_window

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def episode_id(start: float, finding: str) -> str:
    """A stable, shell-safe id: the start time (UTC) and the finding, e.g. 20261126T031200Z-haproxy-maxconn."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(start)) + "-" + _UNSAFE.sub("_", finding)[:60]


def _rank(f: dict) -> tuple:
    return (SEVERITY_RANK.get(f.get("severity"), len(SEVERITY_RANK)), -(f.get("impact") or 0))


def _consecutive(prev: dict | None, rec: dict) -> bool:
    return prev is not None and prev["run"] == rec["run"] and rec["seq"] == prev["seq"] + 1


def _open_episode(rec: dict, f: dict) -> dict:
    return {"finding": f["id"], "start": rec["t0"], "end": rec["t1"], "windows": 1, "proxy": rec.get("proxy"),
            "comm": rec.get("comm"), "worst": rec, "worst_finding": f,
            "last_seq": (rec["run"], rec["seq"])}


def _extend(ep: dict, rec: dict, f: dict) -> None:
    ep["end"], ep["windows"], ep["last_seq"] = rec["t1"], ep["windows"] + 1, (rec["run"], rec["seq"])
    if _rank(f) < _rank(ep["worst_finding"]):
        ep["worst"], ep["worst_finding"] = rec, f


def fold(records: list[dict]) -> list[dict]:
    """Every episode in the records (ordered by start, then finding), with the worst window's record
    (`worst`: its head, and `_at` when the recorder read heads only) for `watch show`; records that are
    not windows of this version are skipped."""
    done, current, prev = [], {}, None
    for rec in (r for r in records if is_window(r)):
        if not _consecutive(prev, rec):
            done += current.values()
            current = {}
        seen = {}
        for f in rec["findings"]:
            if isinstance(f, dict) and isinstance(f.get("id"), str):
                seen.setdefault(f["id"], f)
        for fid in [k for k in current if k not in seen]:
            done.append(current.pop(fid))
        for fid, f in seen.items():
            if fid in current:
                _extend(current[fid], rec, f)
            else:
                current[fid] = _open_episode(rec, f)
        prev = rec
    last = (prev["run"], prev["seq"]) if prev else None
    for ep in current.values():
        ep["ongoing"] = ep["last_seq"] == last
    done += current.values()
    return sorted((_finish(ep) for ep in done), key=lambda e: (e["start"], e["finding"]))


def _finish(ep: dict) -> dict:
    f, worst = ep.pop("worst_finding"), ep["worst"]
    ep.pop("last_seq")
    ep.setdefault("ongoing", False)
    ep.update(id=episode_id(ep["start"], ep["finding"]), severity=f.get("severity"), title=f.get("title"),
              fix=f.get("fix"), peak_evidence=f.get("evidence") or {},
              worst_window={"run": worst["run"], "seq": worst["seq"], "t0": worst["t0"], "t1": worst["t1"]})
    return ep


def between(episodes: list[dict], since: float | None, until: float | None) -> list[dict]:
    """The episodes that overlap [since, until] (either end open)."""
    return [e for e in episodes if (since is None or e["end"] >= since) and (until is None or e["start"] <= until)]


def summary(ep: dict) -> dict:
    """An episode without its worst window's whole record: what `history --json` lists."""
    return {k: v for k, v in ep.items() if k != "worst"}


def find(episodes: list[dict], ident: str) -> dict | None:
    return next((e for e in episodes if e["id"] == ident), None)

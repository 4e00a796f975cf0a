"""A doctor run as a report section: its findings, where an average
request's time went (the time budget) and, when nothing limited the proxy,
its headroom. `proxytune report --from DOCTOR.json` puts it in a report."""

from proxytune.core.sections import Section, Table
from proxytune.probes import budget


def _evidence(f: dict) -> str:
    return "; ".join(f"{k} {v}" for k, v in list((f.get("evidence") or {}).items())[:6] if v not in (None, {}, []))


def section(r: dict) -> Section:
    t = r.get("target") or {}
    sec = Section(f"doctor: {t.get('comm', '?')} (pids {', '.join(map(str, t.get('pids') or []))})",
                  f"A {r.get('window_s', 0):g} s window; verdict: {r.get('verdict', '?')}.")
    if r.get("findings"):
        sec.tables.append(Table("Findings, ranked", ["#", "severity", "finding", "evidence", "fix"],
                                [[i, f["severity"], f"{f['id']}: {f['title']}", _evidence(f), f["fix"]]
                                 for i, f in enumerate(r["findings"], 1)]))
    b = r.get("budget")
    if b:
        sec.tables.append(Table("Time budget of an average request", ["part", "ms per request", "share", "how"],
                                budget.rows(b)))
        sec.notes.append("time budget: " + budget.headline(b))
        sec.notes += [f"{budget.LABELS[n]}: {p['mechanism']}; precision: {p.get('precision') or '-'}"
                      for n, p in b["parts"].items() if p.get("measurable")]
    if r.get("verdict") == "no limit found" and r.get("headroom"):
        sec.tables.append(Table("Headroom (peak in the window, of the limit)", ["what", "used", "limit", "share", "where"],
                                [[h["what"], h.get("used"), h.get("limit"),
                                  "-" if h.get("share") is None else f"{h['share']:.0%}", h.get("where")]
                                 for h in r["headroom"]]))
    return sec

"""One doctor result (a live window, or a watch episode's worst one) as Markdown, for a ticket."""

import json

from .markdown import md_text


def _value(v) -> str:
    text = json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v)
    return md_text(text if len(text) <= 160 else text[:157] + "...")


def render(r: dict, episode: dict | None = None) -> str:
    """The doctor's answer for one window: target, verdict, each finding with its evidence and fix,
    and the headroom on every cap (silence is not an answer)."""
    t = r["target"]
    out = [f"# doctor: {md_text(t['comm'])} (pids {md_text(', '.join(map(str, t['pids'])))})\n"]
    if episode:
        out.append(f"Episode {md_text(episode['id'])}: {episode['windows']} window(s); this is its worst.\n")
    out.append(f"{r['window_s']:.1f} s window; verdict: **{md_text(r['verdict'])}**.\n")
    for i, f in enumerate(r["findings"], 1):
        out.append(f"## {i}. {md_text(f['severity'])} {md_text(f['id'])}: {md_text(f['title'])}\n")
        out += [f"- {md_text(k)}: {_value(v)}" for k, v in f["evidence"].items() if v not in (None, {}, [])]
        out.append(f"\n**fix**: {md_text(f['fix'])}\n")
    rows = r.get("headroom") or []
    if rows:
        out += ["## headroom\n", "| what | used | limit | where |", "|---|---|---|---|"]
        out += [f"| {md_text(h['what'])} | {md_text(h['used'])} | {md_text(h['limit'])} | {md_text(h['where'])} |"
                for h in rows]
    return "\n".join(out) + "\n"

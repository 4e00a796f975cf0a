"""`proxytune report`: run the parts, collect one result JSON, render it.

Today the report holds the host audit; the benchmark and probe sections
join it as those capabilities land (each a section of the same JSON).
"""

import json
from pathlib import Path

from tune import observe, plan as plan_mod
from tune.host import Host

from . import html, markdown
from .schema import envelope


def audit_section(host: Host, profile_ref: str) -> dict:
    plan = plan_mod.build(profile_ref, host, {})
    values = plan.params["values"]
    somaxconn = next((c.current for c in plan.changes if c.setting.address == "sysctl:net.core.somaxconn"), None)
    obs = observe.observe(values["service"], values["cache_dirs"], somaxconn if isinstance(somaxconn, int) else None)
    return {**plan.to_json(), "observations": obs}


def write_report(host: Host, profile_ref: str, out_dir: Path) -> list[Path]:
    audit = audit_section(host, profile_ref)
    doc = envelope("report", {"title": "proxytune report", "sections": {"audit": audit}},
                   audit["params"]["values"]["cache_dirs"])
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "report.json", out_dir / "report.md", out_dir / "report.html"]
    paths[0].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    paths[1].write_text(markdown.render(doc))
    paths[2].write_text(html.render(doc))
    return paths

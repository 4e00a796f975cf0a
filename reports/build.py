"""`proxytune report`: run the parts, collect one result JSON, render it.

Sections: the host audit, then the quick event-mechanism, comm_select and
object-store benchmarks. Each part that cannot run here is recorded with its reason
instead of stopping the report.
"""

import json
from pathlib import Path

from tune import observe, plan as plan_mod
from tune.errors import ProxytuneError
from tune.host import Host

from . import html, markdown
from .schema import envelope
from .tables import sections


def audit_section(host: Host, profile_ref: str) -> dict:
    plan = plan_mod.build(profile_ref, host, {})
    values = plan.params["values"]
    somaxconn = next((c.current for c in plan.changes if c.setting.address == "sysctl:net.core.somaxconn"), None)
    obs = observe.observe(values["service"], values["cache_dirs"], somaxconn if isinstance(somaxconn, int) else None)
    return {**plan.to_json(), "observations": obs}


def collect(host: Host, profile_ref: str, benches: bool = True, quiet: bool = False) -> tuple[dict, dict]:
    """(sections, parts that could not run, with why)."""
    import os
    from microbench import events, fdscan, storage
    parts = {"audit": lambda: audit_section(host, profile_ref)}
    if benches:
        parts["events"] = lambda: events.run(quick=True, quiet=quiet)
        parts["fdscan"] = lambda: fdscan.run(quick=True, quiet=quiet)
        parts["storage"] = lambda: storage.run(quick=True, quiet=quiet) if os.geteuid() == 0 else _needs_root()
    done, skipped = {}, {}
    for name, run in parts.items():
        try:
            done[name] = run()
        except ProxytuneError as e:
            skipped[name] = e.message
    return done, skipped


def _needs_root():
    raise ProxytuneError("bench storage needs root (loop devices and mounts)")


def write_report(host: Host, profile_ref: str, out_dir: Path, benches: bool = True, quiet: bool = False) -> list[Path]:
    done, skipped = collect(host, profile_ref, benches, quiet)
    if "audit" not in done:
        raise ProxytuneError(f"the host audit failed: {skipped['audit']}")
    doc = envelope("report", {"title": "proxytune report", "sections": done, "skipped": skipped},
                   done["audit"]["params"]["values"]["cache_dirs"])
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "report.json", out_dir / "report.md", out_dir / "report.html"]
    paths[0].write_text(json.dumps(doc, indent=1, default=str) + "\n")
    paths[1].write_text(markdown.render(doc))
    paths[2].write_text(html.render(doc))
    for s in sections(doc):
        for f in s.figures:
            (out_dir / f.name).write_bytes(f.png)
            paths.append(out_dir / f.name)
    return paths

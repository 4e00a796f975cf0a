"""`proxytune report`: run the parts, collect one result JSON, render it.

Sections: the host audit, then the quick event-mechanism, comm_select and
object-store benchmarks. Each part that cannot run here is recorded with its reason
instead of stopping the report.
"""

import json
import platform
from pathlib import Path

from proxytune.core.errors import ProxytuneError
from proxytune.tune.host import Host

from . import html, markdown, measurements, plots, seeds, summary
from .schema import envelope
from .tables import sections


def _parts(host: Host, profile_ref: str, benches: bool, quiet: bool, with_proxy: bool, full: bool) -> dict:
    """name -> a call that measures it, for every measurement this report runs (reports/measurements.py)."""
    import os
    from .measurements import MEASUREMENTS, Run
    root = os.geteuid() == 0
    wanted = {"always": True, "benches": benches, "with_proxy": with_proxy, "given": False}
    run = Run(host, profile_ref, full, quiet)
    return {m.name: (lambda m=m: m.run(run) if root or not m.needs_root else _needs_root(m.needs_root))
            for m in MEASUREMENTS if wanted[m.part]}


def collect(host: Host, profile_ref: str, benches: bool = True, quiet: bool = False, with_proxy: bool = False,
            saved: dict | None = None, full: bool = False, on_audit=None,
            last: dict | None = None) -> tuple[dict, dict, dict]:
    """(sections, parts that could not run, with why, seconds each section took). `saved` holds bench
    results already measured (from --from files), which are used instead of running those benches.
    on_audit(audit) is called as soon as the audit is done, before any benchmark: the host summary
    comes first. `last`: section -> seconds on this host's last run (last_timings()), the progress
    display's estimates; a section it does not name is estimated from its measurement's budget."""
    from proxytune.microbench import runner
    from .progress import Sections
    parts = _parts(host, profile_ref, benches, quiet, with_proxy, full)
    for name, data in (saved or {}).items():
        parts[name] = lambda data=data: data
    plan = []
    for n in parts:
        m = measurements.by_name(n)      # a saved part no measurement names is shown under its own name
        label, (quick_s, full_s) = (m.label, m.budget) if m else (n, (5, 5))
        plan.append((n, label, (last or {}).get(n, full_s if full else quick_s)))
    done, skipped = {}, {}
    with Sections(plan, quiet) as display, runner.steps_to(display.on_step if display.live else None):
        for name, run in parts.items():
            display.begin(name)
            try:
                data = run()
            except ProxytuneError as e:
                skipped[name] = e.message
                display.end(name, e.message)
                continue
            if data.get("available") is False:
                skipped[name] = data["reason"]
                display.end(name, data["reason"])
                continue
            done[name] = data
            display.end(name, "done")
            if name == "audit" and on_audit:
                on_audit(data)
    took = {n: round(t, 1) for n, (t, outcome) in display.done.items() if outcome == "done" and n not in (saved or {})}
    return done, skipped, took


def last_timings(out_dir: Path, full: bool) -> dict | None:
    """Each section's seconds in the report last written to out_dir, when it was this host's and of
    the same kind (quick or --full); None otherwise, or when it cannot be read as a result."""
    path = out_dir / "report.json"
    if not path.is_file():
        return None
    try:
        doc = load_results([path])[0]
    except ProxytuneError:
        return None
    t = doc["data"].get("timings") or {}
    if doc["kind"] != "report" or t.get("full") != full or doc["host"].get("hostname") != platform.node():
        return None
    secs = t.get("sections")
    return {k: float(v) for k, v in secs.items() if isinstance(v, (int, float)) and v >= 0} \
        if isinstance(secs, dict) else None


def _needs_root(what: str = "bench storage"):
    raise ProxytuneError(f"{what} needs root")


MAX_RESULT_BYTES = 64 << 20      # the largest result here is 0.5 MB; a FIFO or /dev/zero must not hang or fill memory


def read_result(path: Path) -> str:
    """A result file's text: a regular file (a symlink to one is fine) of bounded size, opened
    without blocking so a FIFO is refused, not waited on."""
    import os
    import stat
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_RESULT_BYTES:
            raise ValueError(f"{st.st_size:,} bytes, more than any result ({MAX_RESULT_BYTES >> 20} MiB)")
        return f.read(MAX_RESULT_BYTES + 1).decode()


def load_results(paths: list[Path]) -> list[dict]:
    """Result files, validated; a file that is not a proxytune result is one clear error."""
    import jsonschema
    from .schema import validate
    docs = []
    for p in paths:
        try:
            doc = json.loads(read_result(Path(p)))
            validate(doc)
        except RecursionError:
            raise ProxytuneError(f"{p}: cannot read it: JSON nested too deeply to be a proxytune result") from None
        except (OSError, ValueError) as e:
            raise ProxytuneError(f"{p}: cannot read it: {e}")
        except jsonschema.ValidationError as e:
            raise ProxytuneError(f"{p}: not a proxytune result: {e.message}")
        docs.append(doc)
    return docs


def saved_benches(paths: list[Path]) -> dict:
    """bench name -> data, from result files (bench results, or a whole report's sections)."""
    out = {}
    for doc in load_results(paths):
        if doc["kind"] == "bench":
            out[doc["data"]["bench"]] = doc["data"]
        elif doc["kind"] == "report":
            out.update({k: v for k, v in doc["data"]["sections"].items() if k not in ("audit", "seeds")})
        elif doc["kind"] == "probe" and doc["data"].get("probe") == "doctor":
            out["doctor"] = doc["data"]
        else:
            raise ProxytuneError(f"a {doc['kind']} result cannot be a report section", "give bench or report results")
    return out


def write_doc(doc: dict, out_dir: Path) -> list[Path]:
    """report.{json,md,html} and the figures, each written atomically through the safe file layer
    (out_dir may be a relative default in a directory another user owns)."""
    secs = sections(doc)            # once: each figure is drawn once, for the three files that show it
    texts = {"report.json": json.dumps(doc, indent=1, default=str) + "\n", "report.md": markdown.render(doc, secs),
             "report.html": html.render(doc, secs)}
    texts.update({f.name: f.png for s in secs for f in s.drawn_figures()})
    return write_files(out_dir, texts)


def write_files(out_dir: Path, texts: dict[str, str | bytes]) -> list[Path]:
    """name -> content, written into out_dir with files.write_output (no link followed, atomic)."""
    from proxytune.tune import files
    for name in texts:
        files.check_output(out_dir / name)
    for name, data in texts.items():
        files.write_output(out_dir / name, data)
    return [out_dir / name for name in texts]


def write_report(host: Host, profile_ref: str, out_dir: Path, benches: bool = True, quiet: bool = False,
                 with_proxy: bool = False, saved: dict | None = None, full: bool = False,
                 on_audit=None) -> tuple[list[Path], dict]:
    from proxytune.tune import files
    for name in ("report.json", "report.md", "report.html"):     # refused now, not after the benches ran
        files.check_output(out_dir / name)
    done, skipped, took = collect(host, profile_ref, benches, quiet, with_proxy, saved, full, on_audit,
                                  last_timings(out_dir, full))
    if "audit" not in done:
        raise ProxytuneError(f"the host audit failed: {skipped['audit']}")
    done["seeds"] = {"rows": seeds.rows(done)}
    doc = envelope("report", {"title": "proxytune report", "summary": summary.build(done), "sections": done,
                              "skipped": skipped, "timings": {"full": full, "sections": took}},
                   done["audit"]["params"]["values"]["cache_dirs"])
    if not plots.available() and any(s.figures for s in sections(doc)):
        skipped["plots"] = plots.MISSING
    return write_doc(doc, out_dir), doc

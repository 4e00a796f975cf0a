"""Render docs/DIAGNOSIS.md from the live matrix's results file (one JSON
line per doctor run, written when PROXYTUNE_MATRIX_RESULTS names it):
which own cap each proxy is diagnosed with under which load, the fix as
the doctor printed it, the test that proves it, and each run's result.

    PROXYTUNE_MATRIX_RESULTS=/tmp/r.jsonl .venv/bin/python -m pytest tests/test_matrix_owncap.py
    PROXYTUNE_MATRIX_RESULTS=/tmp/g.jsonl .venv/bin/python -m pytest tests/test_matrix_generic.py
    .venv/bin/python tests/diagnosis_doc.py /tmp/r.jsonl [docs/DIAGNOSIS.md] [--evidence DIR] [--generic /tmp/g.jsonl]
        [--latency /tmp/l.jsonl [--latency-evidence DIR]]

The latency matrix alone (tests/test_matrix_latency.py, PROXYTUNE_LATENCY_RESULTS), its section of an
existing docs/DIAGNOSIS.md replaced in place, and its evidence kept for tests/test_latency_replay.py:

    .venv/bin/python tests/diagnosis_doc.py --latency /tmp/l.jsonl --latency-evidence DIR [docs/DIAGNOSIS.md]

Without --latency, the latency section already in the destination is kept as it is (it comes from
the full latency matrix, PROXYTUNE_LATENCY_FULL=1, which CI does not run).

With --evidence DIR (the live run's PROXYTUNE_EVIDENCE_DIR) it also keeps one representative run
per cell as tests/evidence/owncap/CELL.json for the replay test: a run that shows its cell's
condition, with the outcome most of the cell's runs had.
"""

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generic_cells  # noqa: E402
import latency_cells  # noqa: E402
import matrix  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SHAPES = {"idle": "idle keep-alive clients above the cap + light wrk", "busy": "wrk connections well above the cap",
          "slow": f"reverse proxy, origin {int(matrix.SLOW_S * 1000)} ms per answer, nothing cached",
          "healthy": "paced load far below every cap",
          "cpu": "the loop at a full core on work of its own (gzip level 9 per response)"}

HOW = """## How a rule is added

A rule reads only the evidence dict (`doctor.gather`: bpftrace maps, /proc, TcpExt deltas, each
listener's accept queue, the proxy's stats and config with `file:line` per directive), so it is a
pure function, replayable on recorded evidence. A proxy's cap is data: the directive, how the proxy
counts usage against it, what it does at the cap (stops accepting, queues, drops, closes idle
keep-alives) and the source that says so (the proxy's source file and function, or its
documentation section). Thresholds come from that mechanism, never from one test's numbers.

The one own-cap rule (`probes/owncap.py`) turns a cap the proxy holds, or refusals it counted, into
the finding, with the kernel's queue as its evidence; a generic rule lives in `probes/findings.py`.

1. Name the mechanism and its source in the rule's docstring or comment.
2. Add a cell to `tests/matrix.py` (`CELLS`): proxy, shape, cap, stats interface on or off; the
   harness's `holds_cap` must say how this proxy's own count shows the cap, so a cell whose load
   missed the cap fails as a harness failure, not as a rule that passed.
3. Run the live cell (`tests/test_matrix_owncap.py -k CELL`, root, with
   `PROXYTUNE_EVIDENCE_DIR` and `PROXYTUNE_MATRIX_RESULTS` set); all 3 doctor runs must hold.
4. Keep one run's JSON as `tests/evidence/owncap/CELL.json`; `tests/test_matrix_replay.py` then
   replays the rules on it without root or proxies.
5. Re-render this page: `.venv/bin/python tests/diagnosis_doc.py RESULTS.jsonl`.

## How a proxy module is added

A proxy is one module in `proxies/`, found by the registry (`proxies/__init__.py`) by itself and
checked when it is imported: a module that leaves out a piece the others rely on fails there,
naming it. The module fills in the three roles a proxy plays here (`proxies/base.py`):

- its `Spec`, what we know without a process: `exe_names`, Debian's `unit`, `user` and `package`
  (the launcher and `make deps` install it), its place in `--proxy all` and in detection (`order`),
  the config files it reads on a host and the cache directories they name (`host_configs`,
  `cache_dirs_in`: tune's detection), its caps as data (`caps(ev)` returns `proxies.cap.Cap`s) and
  its fixes in its own terms (`fd_fix`, `port_fix`, `backlog_fix`, `churn_fix`), all pure over
  recorded evidence; and for `bench proxy` its `stores`, how one is started here (`launch`, with a
  block device for `device_stores`) and the counters it keeps of its own hits and failures
  (`counters`, `failures`, named by `hit_ratio_from`);
- its `Running` class, one process of it, read as that process would read: its config path from
  its command line (`config_arg`), its includes (`include_re`), its directives with `file:line`
  (`parse`) and its statistics (`stats`); and, optionally, its own clocks for the time budget:
  `timing()` reads them around the doctor's window (pieces in `proxies/timing.py`) and
  `config_origins()` names its origins from the config, while the Spec's `time_parts(p)` and
  `origins(p)` turn the record into the budget's parts (a proxy without them gets a kernel-only
  budget), with `slow_origin_fix`/`queue_fix` for fixes in its own terms;
- its server class (`proxies/launch.py`): the proxy from Debian's package with a generated config
  in a temp dir, on loopback, resolving nothing off the host.

Then one profile TOML (`profiles/linux/KIND.toml`), and its tests: its config and caps over
recorded evidence, its cells in `tests/matrix.py` (and in `tests/latency_cells.py` for its clocks). `tests/test_proxy_registry.py` adds a dummy
proxy as one module and shows the doctor, tune, `bench proxy`, the CLI and the launcher pick it up.
"""


def cell_md(text: str) -> str:
    """Text from a result file inside one Markdown table cell: no pipe, no newline, no HTML."""
    return " ".join(str(text).split()).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(
        ">", "&gt;")


def run_mark(r: dict) -> str:
    if r["passed"]:
        return "pass"
    first = r["ids"][0] if r["ids"] else "none"
    why = "harness" if any(p.startswith("harness") for p in r["problems"]) else "rule"
    return f"FAIL ({why}: {first})"


def render(lines: list[dict]) -> str:
    by_cell: dict[str, list[dict]] = {}
    for r in lines:
        by_cell.setdefault(r["cell"], []).append(r)
    out = ["# Diagnosis matrix: each proxy's own cap", "",
           "Generated by `tests/diagnosis_doc.py` from the live matrix (`tests/test_matrix_owncap.py`). Each "
           f"cell starts a real proxy and its load once and runs the doctor {matrix.RUNS} times "
           f"({matrix.WINDOW} s windows, --no-perf but in the cells marked perf); every run must rank the "
           "proxy's own cap first, name its directive and `file:line`, and send nobody to somaxconn (a healthy "
           "cell: no finding of severity high or medium; with perf, no cpu-hotspot at all and its top functions "
           "in headroom; a cpu cell: cpu-hotspot or cpu-bound first, or the budget's proxy-cpu citing one as its cause). A run fails as *harness* when the evidence "
           "shows the load did not bring the proxy to its cap (or, with perf, to the CPU its cell is about).", "",
           "| failure mode | proxy | cap | stats | expected | finding (run 1) | fix as printed (run 1) | test | runs |",
           "|---|---|---|---|---|---|---|---|---|"]
    for cell in matrix.CELLS:
        runs = sorted(by_cell.get(cell.name, []), key=lambda r: r["run"])
        if not runs:
            continue
        first = runs[0]
        mode = SHAPES[cell.shape] + (", perf" if cell.perf else "") + (" (reported issue)" if cell.issue else "")
        test = f"`tests/test_matrix_owncap.py::test_owncap_cell[{cell.name}]`"
        out.append("| " + " | ".join(cell_md(x) for x in (
            mode, cell.proxy, cell.cap, "on" if cell.stats else "off", cell.expect,
            first["ids"][0] if first["ids"] else "none", first["fix"] or "-")) + f" | {test} | "
            + cell_md(", ".join(run_mark(r) for r in runs)) + " |")
    issues = [c for c in matrix.CELLS if c.issue]
    out += ["", "Reported misdiagnoses reproduced as cells:", ""]
    out += [f"- `{c.name}`: {cell_md(c.issue)}" for c in issues]
    return "\n".join(out) + "\n\n" + HOW


def generic_md(lines: list[dict]) -> list[str]:
    """The generic failure modes on real proxies (tests/test_matrix_generic.py), each run judged by the
    cell's verdict (generic_cells.verdict_errors)."""
    by_cell: dict[str, list[dict]] = {}
    for r in lines:
        by_cell.setdefault(r["cell"], []).append(r)
    out = ["## Generic failure modes on real proxies", "",
           "Generated from `tests/test_matrix_generic.py`: each cell puts one proxy in a network namespace of "
           "its own with one fault, runs the doctor 3 times and judges every run: the finding named, ranked "
           "first where it must be, and its fix in that proxy's own terms.", "",
           "| failure mode | proxy | finding | fix of the first finding, as printed (run 1) | test | runs |", "|---|---|---|---|---|---|"]
    for cell, (proxy, modes, _) in generic_cells.EXPECT.items():
        runs = sorted({r["run"]: r for r in by_cell.get(cell, [])}.values(), key=lambda r: r["run"])
        if not runs:
            continue
        marks = []
        for r in runs:
            wrong = generic_cells.verdict_errors(cell, [(i, r["first_fix"] if i == r["ids"][0] else "")
                                                        for i in r["ids"]] if r["ids"] else [])
            marks.append("pass" if not [w for w in wrong if "fix does not name" not in w] else "FAIL")
        fid = ", ".join(f for f, _ in modes.values())
        out.append("| " + " | ".join(cell_md(x) for x in (", ".join(modes), proxy, fid, runs[0]["first_fix"] or "-"))
                   + f" | `tests/test_matrix_generic.py::test_generic_fault_named_on_every_run[{cell}]` | "
                   + cell_md(", ".join(marks)) + " |")
    return out + [""]


LATENCY_HEAD = "## Latency matrix: where a request's time goes"
# Why the cells that still fail do, from their recorded evidence (2026-11-28 09:12-09:21 UTC run); kept by hand
# here so a regenerated page keeps it. A cell that starts passing: drop its paragraph.
LATENCY_OPEN = """### Two cells that once failed, and what they taught

- `varnish-queue-max10x1`, `varnish-queue-max20x1` failed (budget 412-435 ms against the clients' 170 ms):
  4-12 of the wrk connections sat in the listener's accept queue at every tick of every look, never
  accepted: a pool with queued sessions does not run its acceptor (bin/varnishd/cache/cache_pool.c). Little's
  law averaged their queue into the served requests' time, though none of theirs was served. The budget now
  counts the connections seen at every tick as the same established socket that no process holds (inode 0:
  not accepted yet), by 4-tuple, apart: "N connection(s) waited in the accept queue the whole window, never
  accepted", in the headline and in the own cap's finding (`never_accepted`), or as `accept-wait` when no cap
  is reached (a helper's attack found a stopped nginx worker, a reuseport worker stopped beside a live one and
  a stalled server sharing its port number with another, all named since). These two cells' rows below are
  from a run of them with that method (13:47-13:48 UTC).
- `trafficserver-queue-max4`, `trafficserver-queue-max8` failed (budget 123-150 ms against wrk's 252 ms):
  wrk's printed mean was not its requests' mean. wrk.c corrects its histogram for coordinated omission before
  printing (stats_correct: every latency above twice the expected interval adds samples below it), and
  Traffic Server's polled, unfair per-origin queue has such a tail (p99 2-2.7 s): 643 ms printed, 315 ms in
  the proxy's log of the same 1,144 requests, 320 ms by Little's law on wrk's own counts. The matrix now takes
  the smaller of wrk's mean and Little's law when wrk corrected (both bound the mean from above) and names
  which. Every Traffic Server cell waits one log flush longer before its first look (the doctor reads ATS's
  log 6 s back, and a first look read the load's first, slower seconds: `trafficserver-slow400-plain` 461-480
  ms for its 400 ms origin in two full runs, 400 ms since), its queue cells 2 s more (the queue's tail grows)
  and look 6 s: few long waits make a short window's mean noisy (4 s looks read 0.90-1.26 of the clients'
  mean, 6 s looks 0.76-1.04 before the longer wait, 0.90-1.04 after). Traffic Server's rows below are from
  a run of its five cells with that wait (12:29-12:32 UTC), the others' from the full run before it
  (12:20-12:29 UTC).
"""


def latency_md(lines: list[dict]) -> list[str]:
    """The latency matrix (tests/test_matrix_latency.py): per cell what was set, the verdict expected, the
    first finding and each look (for a slow origin the measured wait against the real delay; every look's
    budget total against wrk's mean latency); then each cell's budget as the doctor printed it (look 1)."""
    by_cell: dict[str, list[dict]] = {}
    for r in lines:
        by_cell.setdefault(r["cell"], []).append(r)
    out = [LATENCY_HEAD, "",
           f"Generated from `tests/test_matrix_latency.py`: each cell starts an origin whose delay the test sets, a "
           f"real proxy in front of it and wrk once, then runs the doctor {latency_cells.RUNS} times "
           f"({latency_cells.WINDOW} s windows, 6 s for Traffic Server's queue cells, --no-perf). A slow origin must be `slow-origin` first, named by "
           f"address, its measured wait within {int(latency_cells.ORIGIN_TOLERANCE * 100)} % of the real delay (where "
           "the kernel alone could only bound it, behind reused origin connections, the finding says 'at least' "
           "and the real delay must lie within the bounds, shown lower-upper); a queue inside the proxy "
           "`proxy-queue` first (Varnish: its own cap `varnish-thread-pool`, carrying the queue's wait), with the "
           "directive and where it is set; a fast proxy no "
           f"budget finding and a total under {latency_cells.FAST_TOTAL_MS:g} ms. Every look's budget total must "
           "agree with the clients' mean (wrk's, or where wrk corrected its histogram for coordinated omission the "
           f"smaller of it and Little's law on wrk's counts) within {int(latency_cells.CLIENT_TOLERANCE * 100)} % (or "
           f"{latency_cells.CLOCK_MS:g} ms or the half-width the clocks state; for a bounded wait, between the total and "
           "its upper bound); a look that does not says "
           "so. `stats` is the proxy's own timing interface (stats socket, a log format with its times, "
           "stats_over_http).", "",
           "| cell | proxy | set up | stats | expected | finding (look 1) | looks: origin wait / real delay, budget "
           "total / clients' mean | test |", "|---|---|---|---|---|---|---|---|"]
    shown = []
    for cell in latency_cells.CELLS:
        runs = sorted(by_cell.get(cell.name, []), key=lambda r: r["run"])
        if not runs:
            continue
        shown.append((cell, runs[0]))
        looks = "; ".join(_look(r) for r in runs)
        out.append("| " + " | ".join(cell_md(x) for x in (
            cell.name, cell.proxy, cell.what, "on" if cell.stats else "off", cell.expect,
            runs[0]["ids"][0] if runs[0]["ids"] else "none", looks))
            + f" | `tests/test_matrix_latency.py::test_latency_cell[{cell.name}]` |")
    out += ["", LATENCY_OPEN, "### Budgets as printed (look 1 of each cell)", ""]
    for cell, first in shown:
        text = "\n".join(fence_line(x) for x in (first.get("budget_text") or "no budget").splitlines())
        out += [f"`{cell.name}` ({cell_md(cell.what)}):", "", "```text", text, "```", ""]
    return out


def fence_line(text: str) -> str:
    """A line from a result file inside a fenced block: printable characters only, no fence of its own."""
    return "".join(c if c.isprintable() else "?" for c in text).replace("`", "'")


def _look(r: dict) -> str:
    a = r.get("agreement") or {}
    most = f"-{r['origin_wait_upper_ms']:.0f}" if r.get("origin_wait_upper_ms") is not None else ""
    wait = (f"{r['origin_wait_ms']:.0f}{most}/{r['delay_ms']:.0f} ms, " if r.get("origin_wait_ms") is not None
            and r.get("delay_ms") else "")
    total = (f"{a['total_ms']:.1f}/{a['client_ms']:.1f} ms" if a.get("total_ms") is not None and a.get("client_ms")
             else "no total")
    verdict = "pass" if r["passed"] else "FAIL (" + "; ".join(p.split(":")[0] for p in r["problems"])[:120] + ")"
    return f"{verdict}: {wait}{total}{'' if a.get('agrees') else ' (disagree)'}"


def splice(text: str, section: list[str]) -> str:
    """The document with its latency section replaced (or put before "## How a rule is added")."""
    body = "\n".join(section)
    if LATENCY_HEAD in text:
        head, _, rest = text.partition(LATENCY_HEAD)
        nxt = rest.find("\n## ")
        return head + body + (rest[nxt + 1:] if nxt >= 0 else "")
    head, mark, how = text.partition("## How a rule is added")
    return head + body + "\n" + mark + how


def kept_latency(text: str) -> list[str]:
    """The latency section of an existing document, as lines, for splice()."""
    rest = text[text.index(LATENCY_HEAD):]
    nxt = rest.find("\n## ", 1)
    return (rest[:nxt] if nxt >= 0 else rest).rstrip("\n").split("\n") + [""]


def representative(runs: list[dict]) -> dict:
    """The run to keep: its load reached the condition, and it had the cell's majority outcome."""
    shown = [r for r in runs if not any(p.startswith("harness") for p in r["problems"])] or runs
    majority = sum(r["passed"] for r in runs) * 2 > len(runs)
    return next((r for r in shown if r["passed"] == majority), shown[0])


def keep_evidence(lines: list[dict], evidence: Path, dest: Path = matrix.EVIDENCE, passed_only: bool = False) -> None:
    """One representative answer per cell of a results file, from the live run's evidence dir, into dest;
    with passed_only only a cell whose representative look passed (the latency replay asserts the verdict)."""
    by_cell: dict[str, list[dict]] = {}
    for r in lines:
        by_cell.setdefault(r["cell"], []).append(r)
    dest.mkdir(parents=True, exist_ok=True)
    for cell, runs in by_cell.items():
        r = representative(runs)
        if passed_only and not r["passed"]:
            continue
        shutil.copyfile(evidence / f"{cell}.run{r['run']}.json", dest / f"{cell}.json")


def option(argv: list[str], name: str) -> tuple[Path | None, list[str]]:
    if name not in argv:
        return None, argv
    i = argv.index(name)
    return Path(argv[i + 1]), argv[:i] + argv[i + 2:]


def main(argv: list[str]) -> int:
    latency, argv = option(argv, "--latency")
    latency_evidence, argv = option(argv, "--latency-evidence")
    lat = [json.loads(x) for x in latency.read_text().splitlines() if x.strip()] if latency else []
    if latency and (not argv or argv[0].endswith(".md")):       # the latency section alone, into the document
        dest = Path(argv[0]) if argv else REPO / "docs" / "DIAGNOSIS.md"
        dest.write_text(splice(dest.read_text(), latency_md(lat)))
        if latency_evidence:
            keep_evidence(lat, latency_evidence, latency_cells.EVIDENCE, passed_only=True)
        print(f"wrote the latency matrix into {dest} ({len(lat)} looks)")
        return 0
    evidence = generic = None
    if "--evidence" in argv:
        i = argv.index("--evidence")
        evidence, argv = Path(argv[i + 1]), argv[:i] + argv[i + 2:]
    if "--generic" in argv:
        i = argv.index("--generic")
        generic, argv = Path(argv[i + 1]), argv[:i] + argv[i + 2:]
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    lines = [json.loads(x) for x in Path(argv[0]).read_text().splitlines() if x.strip()]
    dest = Path(argv[1]) if len(argv) > 1 else REPO / "docs" / "DIAGNOSIS.md"
    text = render(lines)
    if generic:
        rows = [json.loads(x) for x in generic.read_text().splitlines() if x.strip()]
        head, _, how = text.partition("## How a rule is added")
        text = head + "\n".join(generic_md(rows)) + "\n## How a rule is added" + how
    if lat:
        text = splice(text, latency_md(lat))
    elif LATENCY_HEAD in (old := dest.read_text() if dest.exists() else ""):
        text = splice(text, kept_latency(old))
    dest.write_text(text)
    if evidence:
        keep_evidence(lines, evidence)
    if latency_evidence:
        keep_evidence(lat, latency_evidence, latency_cells.EVIDENCE, passed_only=True)
    print(f"wrote {dest} ({len(lines)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

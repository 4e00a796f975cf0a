"""Every measurement the tool makes, one object each: how the report runs it
and what it needs, its C harness, its time budget, its section, its rows in
`report compare`, the schema of its data, and its hooks into "what to do
first" (summary.py) and "the classic results, today" (seeds.py). The
report (build.py), compare, the seeds and the summary, the tests that build
every harness and check what the packages ship, and the CLI's `bench`
commands all iterate MEASUREMENTS: a new measurement is one object here
and the code it names. A piece left out is a TypeError at import (no field
has a default), a piece that names nothing is a ValueError (check)."""

from dataclasses import dataclass
from typing import Callable

from proxytune.core.resultschema import result_schema
from proxytune.core.sections import Section
from proxytune.microbench import events, fdscan, storage
from proxytune.microbench.build import Harness
from proxytune.tune import audit as audit_mod

from . import compare, seeds, summary, tables
from .doctor import section as doctor_section

PARTS = ("always", "benches", "with_proxy", "given")   # when the report runs it: "given" only from --from


@dataclass(frozen=True)
class Run:
    """What the report hands a measurement's runner."""
    host: object
    profile_ref: str
    full: bool
    quiet: bool


@dataclass(frozen=True)
class Measurement:
    name: str                                       # its key: a report's section, a bench result's `bench`
    label: str                                      # the report's progress line
    budget: tuple[int, int]                         # seconds on a 2-core VM, warm: quick, full (BENCHMARKS.md)
    part: str                                       # when the report runs it (PARTS)
    run: Callable[[Run], dict] | None               # how the report runs it; None: only given (--from)
    needs_root: str | None                          # what needs root, said when it is not (None: anyone)
    harness: Harness | None                         # its C harness (microbench/DIRECTORY), shipped as data
    section: Callable[[dict], Section] | None       # its section of the report; None: none of its own
    compare: tuple[str, Callable[[dict], dict]] | None   # report compare: the grid's title and its rows
    schema: str | None                              # its data's $defs entry in the result schema
    summary: Callable[[dict | None], list[dict]] | None  # its items of "what to do on this host first"
    seeds: tuple[tuple[int, Callable, Callable[[dict], dict | None]], ...]   # (row, seed, its data of the sections)
    command: bool                                   # `proxytune bench NAME` runs it alone

    def __post_init__(self):
        problems = check(self)
        if problems:
            raise ValueError(f"measurement {self.name!r}: {'; '.join(problems)}")


def check(m: Measurement) -> list[str]:
    """What is wrong with a measurement's spec (empty: nothing)."""
    out = []
    if m.part not in PARTS:
        out.append(f"part {m.part!r} is none of {', '.join(PARTS)}")
    if (m.run is None) != (m.part == "given"):
        out.append("a measurement the report runs needs `run`, and only one given from files has none")
    if len(m.budget) != 2 or not all(isinstance(s, int) and s > 0 for s in m.budget):
        out.append("budget is (quick seconds, full seconds), both positive")
    if m.schema is not None and m.schema not in result_schema()["$defs"]:
        out.append(f"schema {m.schema!r} is not in the result schema's $defs")
    if m.command and m.section is None:
        out.append("a bench command shows its result as the report's section: it needs `section`")
    for entry in m.seeds:
        if len(entry) != 3 or not all(callable(x) for x in entry[1:]):
            out.append("each seed is (row, seed(data), pick(sections))")
    return out


def part_of(*names: str) -> Callable[[dict], dict | None]:
    """The first of these sections the report has."""
    return lambda sections: next((sections[n] for n in names if sections.get(n)), None)


def _cpu_split_part(sections: dict) -> dict | None:
    """A doctor result given, else the doctor's view of the Squid the host settings loaded, else of its nginx."""
    return (sections.get("doctor") or (sections.get("host_settings") or {}).get("cpu_split")
            or sections.get("cpu_split"))


def _hostsettings(r: Run) -> dict:
    from proxytune.microbench import hostsettings
    from proxytune.probes import selfload
    return hostsettings.run(r.host, full=r.full, watch=selfload.PerfWatch, budget_watch=selfload.BudgetWatch)


def _proxy(r: Run) -> dict:
    from proxytune.microbench import proxybench
    return proxybench.run(quick=True, quiet=r.quiet)


def _cpu_split(r: Run) -> dict:
    from proxytune.probes import selfload
    return selfload.cpu_split_on_nginx()


MEASUREMENTS: tuple[Measurement, ...] = (
    Measurement("audit", "host audit", (1, 1), "always", lambda r: audit_mod.build(r.host, r.profile_ref).to_json(),
                None, None, audit_mod.section, ("Host audit", compare.audit_rows), "audit", summary.from_audit, (),
                False),
    Measurement("events", "event mechanisms: select, poll, epoll, io_uring", (4, 480), "benches",
                lambda r: events.run(quick=not r.full, quiet=r.quiet), None, events.HARNESS, tables.events_section,
                ("Event mechanisms: ns per wait, 1 ready (hot)", compare.events_rows), "bench_events",
                summary.from_events, ((1, seeds.select_poll, part_of("events")), (3, seeds.kqueue, part_of("events"))),
                True),
    Measurement("fdscan", "Mogul's comm_select scan", (3, 8), "benches",
                lambda r: fdscan.run(quick=not r.full, quiet=r.quiet), None, fdscan.HARNESS, tables.fdscan_section,
                ("comm_select variants: ns per call", compare.fdscan_rows), "bench_fdscan", None,
                ((2, seeds.mogul, part_of("fdscan")),), True),
    Measurement("storage", "object stores: file per object, large file, raw device, atime", (21, 1050), "benches",
                lambda r: storage.run(quick=not r.full, quiet=r.quiet, seeds_only=not r.full), "bench storage", storage.HARNESS,
                tables.storage_section, ("Object stores (ext4, relatime; rawdev)", compare.storage_rows), None,
                summary.from_storage,
                ((4, seeds.largefile, part_of("storage")), (5, seeds.noatime, part_of("storage"))), True),
    Measurement("host_settings", "Squid before/after the host settings (Cooper), CPU split", (26, 400), "benches",
                _hostsettings, "Squid before/after the host settings", None, tables.proxy_section, None, None, None,
                ((6, seeds.cooper, part_of("host_settings", "proxy")),), False),
    Measurement("proxy", "bench proxy: Squid's stores under load", (120, 120), "with_proxy", _proxy, "bench proxy",
                None, tables.proxy_section, ("Proxies under load", compare.proxy_rows), None, None, (), True),
    Measurement("cpu_split", "the doctor on an nginx it starts", (10, 10), "with_proxy", _cpu_split, "the doctor",
                None, None, None, None, None, ((7, seeds.cpu_split, _cpu_split_part),), False),
    Measurement("doctor", "a doctor result", (1, 1), "given", None, None, None, doctor_section,
                ("doctor findings", compare.doctor_rows), "probe_doctor", summary.from_doctor, (), False),
)


def by_name(name: str) -> Measurement | None:
    return next((m for m in MEASUREMENTS if m.name == name), None)


def harnesses() -> list[Harness]:
    """Every measurement's C harness (what the build cache holds, what the packages ship)."""
    return [m.harness for m in MEASUREMENTS if m.harness is not None]

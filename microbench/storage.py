"""`bench storage`: ufs vs largefile vs rawdev, with sync / threads / POSIX
AIO / io_uring, on filesystems the bench makes itself, against fio's limit.

Per (filesystem, atime mode, store, engine): a fill phase (twice the cache
capacity written, final sync timed), then the filesystem is unmounted and
mounted again (its page cache dropped, nothing else on the host), then a
steady phase of Zipf-popular hits and misses. Each phase runs under
`perf stat -e raw_syscalls:sys_enter`, so syscalls per object are counted.
rawdev runs on a loop device over a sparse file unless --device is given;
either is claimed (rawdev.claim: unused, blank, held O_EXCL) for the whole run,
before the filesystems are benched, so a refusal comes first.
"""

import contextlib
import json
import os
import sys
from pathlib import Path

from proxytune.core import stats
from proxytune.core.capability import perf_counts
from proxytune.core.errors import ProxytuneError
from proxytune.core.numbers import uint

from . import devices, fio, rawdev
from .build import Harness, build
from .runner import HarnessError, progress, unavailable

HARNESS = Harness("objbench", "objbench", flags=("-pthread",), libraries=("-lm",), uring=True)
ENGINES = ["sync", "threads", "posix-aio", "io_uring"]
FS_STORES = ["ufs", "largefile"]
# quick: the headline effects in about 35-40 s here, with 5 seed rounds (docs/BENCHMARKS.md, the report's time):
# a smaller cache, fewer requests, and each fio limit once, only the patterns that bound a phase.
# 18,000 requests: at 6,000 the steady and hit phases lasted 0.2-0.4 s and a seed pair's ratio
# moved +-20 % from one pair to the next (2026-11-28: large file x1.5 to x2.3 in one report; with
# 18,000, noatime's pairs sat within x0.98-1.12 in two reports of three: docs/BENCHMARKS.md)
# 5 seed rounds, not 3: a verdict takes 5 pairs (reports/verdicts.py), and large file sits on an edge
# of the rule (x2.0-2.8 about x2.43): the range of n pairs holds its median in 1 - 2 x 0.5**n of
# reports, so at 3 pairs one report in four decides it either way, at 5 one in sixteen (noatime's row,
# judged by its device counts since, sits at x1.02-1.05, far from an edge)
QUICK = {"fs": ["ext4"], "capacity_mb": 32, "requests": 18000, "reps": 1, "seed_reps": 5, "fio_runtime": 2,
         "fio_reps": 1, "fio_all_patterns": False}
FULL = {"fs": ["ext2", "ext4", "xfs", "btrfs"], "capacity_mb": 128, "requests": 40000, "reps": 2, "seed_reps": 5,
        "fio_runtime": 10, "fio_reps": 5, "fio_all_patterns": True}
# The cells the report's seed rows read (reports/seeds.py), on ext4 (seed_fs()), with one engine:
# threads, Squid's aufs (the noatime row's paper measured aufs). Their A and B alternate round by
# round, seed_reps rounds: large file against file per object (steady), noatime against relatime (hits).
SEED_ENGINE = "threads"
SEED_RUNS = (("relatime", "ufs"), ("relatime", "largefile"), ("noatime", "ufs"))
SEED_PAIRS = {"largefile": (("relatime", "ufs"), ("relatime", "largefile"), "steady"),
              "noatime": (("relatime", "ufs"), ("noatime", "ufs"), "hit")}


def disk_stat(dev: str) -> dict:
    """Completed read/write I/Os and sectors of a block device, and its cache flushes (a journal
    commit's barrier; kernels since 5.5 count them), from /sys/block/NAME/stat
    (Documentation/block/stat.rst)."""
    f = (Path("/sys/block") / Path(dev).name / "stat").read_text().split()
    return {"read_ios": int(f[0]), "read_sectors": int(f[2]), "write_ios": int(f[4]), "write_sectors": int(f[6]),
            "flush_ios": int(f[15]) if len(f) > 15 else 0}


def run_phase(exe, store, engine, phase, path, state, cap, requests, count: bool, dev: str | None = None) -> dict:
    before = disk_stat(dev) if dev else None
    doc = _run_phase(exe, store, engine, phase, path, state, cap, requests, count)
    if before and doc.get("available"):
        after = disk_stat(dev)
        doc["device_io"] = {k: after[k] - before[k] for k in after}
    return doc


def _run_phase(exe, store, engine, phase, path, state, cap, requests, count: bool) -> dict:
    argv = [str(exe), "--store", store, "--engine", engine, "--phase", phase, "--path", str(path),
            "--capacity-mb", str(cap), "--requests", str(requests), "--verify"]
    if state:
        argv += ["--state", str(state)]
    cmd = ["taskset", "-c", str(objbench_cpu())] + (["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter"]
                                                   if count else []) + argv
    p = devices.run_child(cmd, timeout=1800)
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"available": False, "reason": f"objbench printed no JSON: {(p.stderr or p.stdout)[-200:]}"}
    if "error" in doc:
        return {"available": False, "reason": doc["error"], "command": " ".join(argv)}
    doc["command"] = " ".join(argv[1:])
    if count and doc.get("available"):
        line = next((l for l in p.stderr.splitlines() if "raw_syscalls:sys_enter" in l), "")
        doc["syscalls"] = uint(line.split(",")[0])
        doc["syscalls_per_object"] = doc["syscalls"] / doc["requests"] if doc["syscalls"] else None
    return doc


def objbench_cpu() -> int:
    """The one CPU every objbench phase runs on, its threads included: the last we may use. Unpinned,
    a phase's speed followed where the scheduler put its threads on this 2-core VM, and a seed pair's
    ratio with it (2026-11-28, 8 alternating pairs of the large-file row's steady phases each:
    unpinned x1.98-2.55, file per object 34,010-46,744 objects/s; on CPU 0 x2.16-2.68, one large-file
    phase 17 % slow; on CPU 1 x2.56-2.63, 36,042-37,374 and 93,112-95,582). The last, not the first:
    the one that was steadier here (why CPU 0 had the slow phase was not found), and not the CPU
    the Cooper section gives Squid."""
    return max(os.sched_getaffinity(0))


def filesystems(listed: str | None) -> list[str] | None:
    """--fs ext4,xfs as a list (None: the plan's own), refused when it names a filesystem we cannot make."""
    fs_list = [f.strip() for f in listed.split(",")] if listed else None
    if fs_list and (bad := [f for f in fs_list if f not in devices.MKFS]):
        raise ProxytuneError(f"unknown filesystem {bad[0]!r}", f"known: {', '.join(devices.MKFS)}")
    return fs_list


def run(quick: bool = False, fss: list[str] | None = None, device: str | None = None, force: bool = False,
        engines: list[str] | None = None, quiet: bool = False, seeds_only: bool = False) -> dict:
    """seeds_only (the quick report): the seed cells alone, no fio limit, no raw device unless one
    is given (report --full runs the whole matrix)."""
    plan = dict(QUICK if quick else FULL)
    engines = engines or ENGINES
    if seeds_only:
        plan["reps"], plan["fio"], engines = 0, False, [SEED_ENGINE]
    image_mb = plan["capacity_mb"] * 3 + 64
    read_mb = max(plan["capacity_mb"], int(plan["requests"] * 10.6 / 1024))     # steady phase: ~10.6 KB per request
    if device is not None:
        rawdev.resolve(device)          # '' or not a block device: an error before anything is made
    try:
        build(HARNESS)               # before any loop device is made; cached for _prepare
    except HarnessError as e:
        return unavailable({"bench": "storage", "quick": quick}, e)
    with devices.Sandbox() as sb, contextlib.ExitStack() as held:
        for line in sb.reaped:
            print(f"proxytune: {line}", file=sys.stderr)
        raw = not seeds_only or device is not None
        claimed = held.enter_context(rawdev.claim(sb.loop(image_mb, "rawdev") if device is None else device,
                                                  force)) if raw else None
        exe, syscalls, result, usable = _prepare(plan, fss or plan["fs"], quick, engines)
        result["reaped_leftovers"] = sb.reaped
        n_fio = lambda direct: len(fio.patterns(direct, plan["fio_all_patterns"])) * len(engines)
        total = sum(len(cells(plan, engines, seeds=fs == seed_fs(usable))) + n_fio(0) * plan.get("fio", True)
                    for fs in usable) \
            + (len(engines) * plan["reps"] + n_fio(1) if raw else 0)
        bar = held.enter_context(progress(quiet))
        task = bar.add_task("bench storage", total=total)
        _bench_filesystems(result, sb, bar, task, exe, usable, plan, image_mb, read_mb, engines, syscalls)
        if raw:
            _bench_rawdev(result, sb, bar, task, exe, claimed, device, plan, read_mb, engines, syscalls)
    result.update(derive(result))
    return result


def _prepare(plan: dict, fss: list[str], quick: bool, engines: list[str]):
    """The harness, whether perf counts syscalls, the result skeleton, and the filesystems we can make."""
    exe = build(HARNESS)
    syscalls = perf_counts("raw_syscalls:sys_enter")
    result = {"bench": "storage", "quick": quick, "capacity_mb": plan["capacity_mb"], "requests": plan["requests"],
              "reps": plan["reps"], "seed_reps": plan["seed_reps"], "seed_engine": SEED_ENGINE,
              "syscall_counting": "perf stat -e raw_syscalls:sys_enter" if syscalls.ok else f"unavailable: {syscalls.why}",
              "fs_skipped": {}, "runs": [], "fio": [], "bssplit": fio.mix_bssplit(),
              "fio_family": {e: dict(zip(("ioengine", "iodepth", "numjobs"), fio.FAMILY[e])) for e in engines}}
    usable = []
    for fs in fss:
        mkfs = devices.mkfs_available(fs)
        if not mkfs.ok:
            result["fs_skipped"][fs] = mkfs.why
        else:
            usable.append(fs)
    return exe, syscalls, result, usable


def seed_fs(usable: list[str]) -> str | None:
    """The filesystem of the seed rows' cells: ext4 (the quick report's, Debian's default), else the first."""
    return "ext4" if "ext4" in usable else (usable[0] if usable else None)


def cells(plan: dict, engines: list[str], seeds: bool = True) -> list[tuple[int, str, str, str]]:
    """(round, atime, store, engine) in the order they run on a filesystem, round by round: the seed
    cells (with `seeds`, on seed_fs()) for seed_reps rounds, every other cell for reps
    rounds. Each round runs in the reverse order of the one before (ABBA...: a drift of the host
    moves a seed row's A and B alike)."""
    seed = [(a, s, SEED_ENGINE) for a, s in SEED_RUNS if SEED_ENGINE in engines] if seeds else []
    others = [(a, s, e) for a in ("relatime", "noatime") for s in FS_STORES for e in engines if (a, s, e) not in seed]
    seed_reps = max(plan["seed_reps"], plan["reps"]) if seed else 0
    out = []
    for r in range(max(seed_reps, plan["reps"])):
        batch = (seed if r < seed_reps else []) + (others if r < plan["reps"] else [])
        out += [(r, *c) for c in (batch if r % 2 == 0 else batch[::-1])]
    return out


def _bench_filesystems(result, sb, bar, task, exe, usable, plan, image_mb, read_mb, engines, syscalls) -> None:
    """ufs and largefile on each filesystem, relatime and noatime, each run on a filesystem of its
    own (cells(): the seed rows' cells on seed_fs()); fio's buffered limit on each filesystem."""
    for fs in usable:
        for rep, atime, store, engine in cells(plan, engines, seeds=fs == seed_fs(usable)):
            bar.update(task, description=f"{fs} {atime} {store} {engine} #{rep + 1}")
            dev, mp = sb.fresh(fs, image_mb, f"{fs}-{atime}-{store}-{engine}-{rep}", atime)
            try:
                result["runs"].append(_fs_run(sb, exe, dev, mp, fs, atime, store, engine, rep, plan, syscalls))
            finally:
                sb.discard(dev, mp)
            bar.advance(task)
        if not plan.get("fio", True):              # the quick report: the seed cells alone, no limit to set them against
            continue
        bar.update(task, description=f"fio (buffered, on {fs})")          # each filesystem's own limit
        dev, mp = sb.fresh(fs, image_mb, f"{fs}-fio", "relatime")
        for engine in engines:
            for name, job in fio.jobs(str(mp / "fio.dat"), plan["capacity_mb"], read_mb, plan["fio_runtime"],
                                      0, result["bssplit"], engine, plan["fio_all_patterns"]).items():
                result["fio"].append({**fio.best_of(name, job, sb.dir, plan["fio_reps"]), "fs": fs,
                                      "target": f"{fs} file", "engine": engine})
                bar.advance(task)
        sb.discard(dev, mp)


def _fs_run(sb, exe, dev, mp, fs, atime, store, engine, rep, plan, syscalls) -> dict:
    """One fill / steady / hit sequence of a store on a new filesystem, each phase from a cold page cache."""
    cap, requests = plan["capacity_mb"], plan["requests"]
    path = mp / (f"ufs-{engine}" if store == "ufs" else f"cache-{engine}.log")
    if store == "ufs":
        path.mkdir()
    state = sb.dir / f"{fs}-{atime}-{store}-{engine}.state"
    fill = run_phase(exe, store, engine, "fill", path, state, cap, requests, syscalls.ok, dev)
    steady = hit = None
    if fill.get("available"):
        sb.remount_cold(dev, mp, atime)
        steady = run_phase(exe, store, engine, "steady", path, state, cap, requests, syscalls.ok, dev)
        if store == "ufs":      # reads alone, from a cold page cache: the atime question
            sb.remount_cold(dev, mp, atime)
            hit = run_phase(exe, store, engine, "hit", path, state, cap, requests, syscalls.ok, dev)
    state.unlink(missing_ok=True)
    return {"fs": fs, "atime": atime, "store": store, "engine": engine, "rep": rep, "fill": fill, "steady": steady,
            "hit": hit}


def _bench_rawdev(result, sb, bar, task, exe, claimed, device, plan, read_mb, engines, syscalls) -> None:
    """The log store straight on the claimed device (O_DIRECT), then fio's direct limit on it."""
    cap, raw = plan["capacity_mb"], claimed.path
    result["rawdev_target"] = raw if device is not None else "loop device over a sparse file"
    result["rawdev_check"] = {"device": raw, "size_bytes": claimed.size, "sampled_bytes": claimed.checked_bytes,
                              "notes": claimed.notes}
    for note in claimed.notes:
        print(f"proxytune: {note}", file=sys.stderr)
    for engine in engines:
        for rep in range(plan["reps"]):
            bar.update(task, description=f"rawdev {engine} #{rep + 1}")
            state = sb.dir / f"rawdev-{engine}.state"
            fill = run_phase(exe, "rawdev", engine, "fill", raw, state, cap, plan["requests"], syscalls.ok, raw)
            steady = run_phase(exe, "rawdev", engine, "steady", raw, state, cap, plan["requests"], syscalls.ok,
                               raw) if fill.get("available") else None
            result["runs"].append({"fs": "raw", "atime": "-", "store": "rawdev", "engine": engine, "rep": rep,
                                   "fill": fill, "steady": steady, "hit": None})
            state.unlink(missing_ok=True)
            bar.advance(task)
    bar.update(task, description="fio (direct, on the raw device)")
    for engine in engines:
        for name, job in fio.jobs(raw, cap, read_mb, plan["fio_runtime"], 1, result["bssplit"], engine,
                                  plan["fio_all_patterns"]).items():
            result["fio"].append({**fio.best_of(name, job, sb.dir, plan["fio_reps"]), "fs": "raw",
                                  "target": "raw device", "engine": engine})
            bar.advance(task)


def _median(runs, phase, key):
    vals = [r[phase][key] for r in runs if r[phase] and r[phase].get("available") and r[phase].get(key) is not None]
    return stats.summary(vals)["median"] if vals else None


def seed_pairs(runs: list[dict]) -> dict:
    """Each seed row's A and B, round by round (cells()), on seed_fs() with SEED_ENGINE: objects/s of
    the row's phase, B / A per round, and each side's device work (device_work()) when counted. A
    round where either side did not run is left out."""
    fs = seed_fs(sorted({x["fs"] for x in runs if x["fs"] != "raw"}))
    out = {}
    for name, (a, b, phase) in SEED_PAIRS.items():
        per = {}
        for x in runs:
            if (x["fs"], x["engine"]) == (fs, SEED_ENGINE) and (x["atime"], x["store"]) in (a, b) \
                    and (x.get(phase) or {}).get("available") and x[phase].get("objects_per_s"):
                per.setdefault(x["rep"], {})[(x["atime"], x["store"])] = x[phase]
        rounds = [per[k] for k in sorted(per) if a in per[k] and b in per[k]]
        if rounds:
            out[name] = {"fs": fs, "engine": SEED_ENGINE, "phase": phase, "a": " ".join(a), "b": " ".join(b),
                         "a_objects_per_s": [p[a]["objects_per_s"] for p in rounds],
                         "b_objects_per_s": [p[b]["objects_per_s"] for p in rounds],
                         "ratios": [p[b]["objects_per_s"] / p[a]["objects_per_s"] for p in rounds]}
            a_dev, b_dev = [device_work(p[a]) for p in rounds], [device_work(p[b]) for p in rounds]
            if any(x and y for x, y in zip(a_dev, b_dev)):             # None in a round without
                out[name]["a_device"], out[name]["b_device"] = a_dev, b_dev
    return out


def device_work(phase: dict) -> dict | None:
    """What one phase asked of its device, per object: operations (reads, writes, cache flushes) and
    sectors moved (read and written); None without the device's counts, and for a saved result from
    before disk_stat() counted flushes (2026-11-28; its ext4 was also zeroing its inode tables in the
    background then, devices.MOUNT_EXTRA): those are judged by their hits/s, as they were."""
    io, n = phase.get("device_io"), phase.get("requests")
    if not io or not n or "flush_ios" not in io:
        return None
    return {"ops_per_object": (io["read_ios"] + io["write_ios"] + io["flush_ios"]) / n,
            "sectors_per_object": (io["read_sectors"] + io["write_sectors"]) / n}


def derive(r: dict) -> dict:
    """The headline numbers: largefile vs ufs fill, the noatime effect, fractions of fio."""
    out: dict = {"combos": [], "fill_ratio_largefile_over_ufs": {}, "noatime_effect": {}, "fraction_of_fio": {}}
    keys = sorted({(x["fs"], x["atime"], x["store"], x["engine"]) for x in r["runs"]})
    for fs, atime, store, engine in keys:
        runs = [x for x in r["runs"] if (x["fs"], x["atime"], x["store"], x["engine"]) == (fs, atime, store, engine)]
        first = runs[0]["fill"]
        row = {"fs": fs, "atime": atime, "store": store, "engine": engine, "available": first.get("available", False)}
        if not row["available"]:
            row["reason"] = first.get("reason")
        else:
            for phase in ("fill", "steady", "hit"):
                for x in runs:
                    if x.get(phase) and "device_io" in x[phase]:
                        x[phase]["write_ios"] = x[phase]["device_io"]["write_ios"]
                for key in ("objects_per_s", "mb_per_s", "syscalls_per_object", "cpu_us_per_object", "hit_ratio",
                            "write_ios"):
                    row[f"{phase}_{key}"] = _median(runs, phase, key)
                row[f"{phase}_latency_us"] = runs[0][phase]["latency_us"] if runs[0].get(phase) else None
            row["bad_reads"] = sum(x[p]["bad_reads"] for x in runs for p in ("fill", "steady") if x[p] and x[p].get("available"))
            row["errors"] = sum(x[p]["errors"] for x in runs for p in ("fill", "steady") if x[p] and x[p].get("available"))
        out["combos"].append(row)
    combo = {(c["fs"], c["atime"], c["store"], c["engine"]): c for c in out["combos"] if c["available"]}
    for fs in sorted({c["fs"] for c in out["combos"] if c["fs"] != "raw"}):
        for engine in ENGINES:
            u, l = combo.get((fs, "relatime", "ufs", engine)), combo.get((fs, "relatime", "largefile", engine))
            if u and l:
                out["fill_ratio_largefile_over_ufs"][f"{fs}/{engine}"] = l["fill_objects_per_s"] / u["fill_objects_per_s"]
            rel, noa = combo.get((fs, "relatime", "ufs", engine)), combo.get((fs, "noatime", "ufs", engine))
            if rel and noa and rel.get("hit_objects_per_s") and noa.get("hit_objects_per_s"):
                out["noatime_effect"][f"{fs}/{engine}"] = {
                    "relatime_hit_objects_per_s": rel["hit_objects_per_s"],
                    "noatime_hit_objects_per_s": noa["hit_objects_per_s"],
                    "gain": noa["hit_objects_per_s"] / rel["hit_objects_per_s"] - 1,
                    "relatime_hit_write_ios": rel["hit_write_ios"],
                    "noatime_hit_write_ios": noa["hit_write_ios"],
                    "relatime_syscalls_per_object": rel["hit_syscalls_per_object"],
                    "noatime_syscalls_per_object": noa["hit_syscalls_per_object"]}
    out["seed_pairs"] = seed_pairs(r["runs"])
    limits = {(f.get("fs"), f["name"]): f for f in r["fio"] if f.get("available")}
    for c in out["combos"]:
        if not c["available"]:
            continue
        key = f"{c['fs']}/{c['atime']}/{c['store']}/{c['engine']}"
        out["fraction_of_fio"][key] = {}
        for phase in ("fill", "steady"):
            name, limit = fio.limit_for(limits, c["fs"], c["store"], c["engine"], phase)
            f = {"vs": name, **fio.fraction(c.get(f"{phase}_mb_per_s"), limit)}
            out["fraction_of_fio"][key][phase] = f
            c[f"{phase}_vs_fio"], c[f"{phase}_fio_error"] = f["fraction"], f["error"]
    return out

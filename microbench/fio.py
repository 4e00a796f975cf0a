"""fio as the limit of each object store: the same pattern the store runs, or it is no limit.

A store keeps `depth` (16) operations in flight through its engine; fio run at
depth 1 with psync is beaten by any store with requests in flight, which makes
the "limit" a measurement error. So each engine gets the fio engine of its
family at the store's own concurrency:

- sync      -> psync, one job, depth 1 (the store's sync engine runs at depth 1)
- threads   -> psync, 16 jobs (the store's thread pool of 16 blocking workers)
- posix-aio -> posixaio (glibc's POSIX AIO, the same library), depth 16
- io_uring  -> io_uring, depth 16

fio's default of scrambling every write buffer (to defeat dedupe) is off: it is
CPU per write that no store spends, and a buffered fill is a memory copy.

The same object-size mix (bssplit), file size, and page-cache state: every
job starts cold (invalidate=1, as the store starts after a remount), buffered
write jobs end with fsync (end_fsync, as a fill's timed final sync), and the
raw device is read and written O_DIRECT, as the rawdev store does.
"""

import json
import random
import shutil
from pathlib import Path

from . import devices, polymix

DEPTH = 16          # objbench's --depth default: operations in flight
THREADS = 16        # objbench's --threads default: the pool's workers
UNIVERSE_ZIPF = 0.8

# store engine -> (fio ioengine, iodepth, numjobs)
FAMILY = {"sync": ("psync", 1, 1), "threads": ("psync", 1, THREADS),
          "posix-aio": ("posixaio", DEPTH, 1), "io_uring": ("io_uring", DEPTH, 1)}
PATTERNS = ("randwrite-mix", "seqwrite-stripe", "randread-mix")


def mix_bssplit(samples: int = 20000, seed: int = 7) -> str:
    """fio bssplit for the PolyMix-3 sizes, rounded up to powers of two from 4 KiB to 1 MiB."""
    rng = random.Random(seed)
    counts: dict[int, int] = {}
    for _ in range(samples):
        kb = polymix.size_kb(rng)
        bs = 4
        while bs < kb and bs < 1024:
            bs *= 2
        counts[bs] = counts.get(bs, 0) + 1
    parts = [(bs, round(100 * n / samples)) for bs, n in sorted(counts.items())]
    parts = [(bs, pct) for bs, pct in parts if pct > 0]
    drift = 100 - sum(p for _, p in parts)
    parts[0] = (parts[0][0], parts[0][1] + drift)
    return ":".join(f"{bs}k/{pct}" for bs, pct in parts)


def job_name(pattern: str, direct: int, engine: str) -> str:
    return f"{pattern}-{'direct' if direct else 'buffered'}-{engine}"


def patterns(direct: int, every: bool = True) -> tuple[str, ...]:
    """The patterns to run: all of them, or only those that bound a store's phase (limit_for):
    O_DIRECT random mix writes bound nothing (the raw device's store writes whole stripes)."""
    return PATTERNS if every or not direct else ("seqwrite-stripe", "randread-mix")


def jobs(target: str, size_mb: int, read_mb: int, runtime: int, direct: int, bssplit: str,
         engine: str, every: bool = True) -> dict[str, str]:
    """The stores' patterns for one store engine: writing twice the cache, as a fill does, at the
    mix's sizes (ufs's fill) or in whole 1 MiB stripes (a log store's), then fsync; and Zipf-popular
    reads over the file at the mix's sizes, as many bytes as a steady phase reads."""
    ioengine, depth, numjobs = FAMILY[engine]
    common = (f"[global]\nfilename={target}\nsize={size_mb}M\nioengine={ioengine}\niodepth={depth}\n"
              f"numjobs={numjobs}\ngroup_reporting=1\ndirect={direct}\nruntime={runtime}\ninvalidate=1\n"
              f"randrepeat=1\nthread=1\nscramble_buffers=0\n")
    share = lambda mb: max(1, mb // numjobs)          # the bytes are the phase's, split over the jobs
    texts = {
        job_name("randwrite-mix", direct, engine): common + (
            f"[randwrite-mix]\nrw=randwrite\nbssplit={bssplit}\nio_size={share(2 * size_mb)}M\nend_fsync=1\n"),
        job_name("seqwrite-stripe", direct, engine): common + (
            f"[seqwrite-stripe]\nrw=write\nbs=1M\nio_size={share(2 * size_mb)}M\nend_fsync=1\n"),
        job_name("randread-mix", direct, engine): common + (
            f"[randread-mix]\nrw=randread\nbssplit={bssplit}\nrandom_distribution=zipf:{UNIVERSE_ZIPF}\n"
            f"io_size={share(read_mb)}M\n"),
    }
    return {job_name(p, direct, engine): texts[job_name(p, direct, engine)] for p in patterns(direct, every)}


def run(name: str, job: str, workdir: Path) -> dict:
    """One fio job file -> {name, available, mb_per_s, iops, job, command} (or why not)."""
    if not shutil.which("fio"):
        return {"name": name, "available": False, "reason": "fio is not installed (Debian: fio)"}
    path = workdir / f"{name}.fio"
    path.write_text(job)
    p = devices.run_child(["fio", "--output-format=json", str(path)], timeout=600)
    try:
        j = json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]
    except (ValueError, KeyError, IndexError):
        return {"name": name, "available": False, "reason": (p.stderr or p.stdout)[-200:], "job": job}
    side = j["write"] if "write" in name else j["read"]
    return {"name": name, "available": True, "mb_per_s": side["bw_bytes"] / 1048576, "iops": side["iops"],
            "job": job, "command": f"fio --output-format=json {path.name}"}


def best_of(name: str, job: str, workdir: Path, reps: int = 5) -> dict:
    """The limit is the most the device did for this pattern: the best of `reps` runs (a job of
    a fill's size takes ~0.1 s, so one run is at the mercy of whatever else the host does)."""
    runs = [run(name, job, workdir) for _ in range(reps)]
    ok = [r for r in runs if r["available"]]
    if not ok:
        return runs[0]
    best = max(ok, key=lambda r: r["mb_per_s"])
    return {**best, "reps": len(ok), "runs_mb_per_s": [round(r["mb_per_s"], 1) for r in ok]}


def limit_for(fio_rows: dict, fs: str, store: str, engine: str, phase: str) -> tuple[str, dict | None]:
    """(job name, fio row) that bounds a store's phase: reads for steady; for fill, random mix
    writes for ufs and whole stripes for the log stores."""
    direct = 1 if store == "rawdev" else 0
    pattern = "randread-mix" if phase == "steady" else ("randwrite-mix" if store == "ufs" else "seqwrite-stripe")
    name = job_name(pattern, direct, engine)
    return name, fio_rows.get((fs, name))


def fraction(store_mb_per_s: float | None, limit: dict | None) -> dict:
    """A store's share of its limit; above 1.0 the limit was not one: flagged, no fraction given."""
    if not limit or not store_mb_per_s:
        return {"fraction": None, "limit_mb_per_s": None, "error": None}
    f = store_mb_per_s / limit["mb_per_s"]
    if f > 1.0:
        return {"fraction": None, "limit_mb_per_s": limit["mb_per_s"],
                "error": f"measurement error: the store ran at x{f:.2f} of fio {limit['name']}, so that is no limit"}
    return {"fraction": f, "limit_mb_per_s": limit["mb_per_s"], "error": None}


def cell(combo: dict, phase: str) -> str:
    """A table cell for a store's share of its limit: the fraction, or the flag when it was no limit
    (result files written before the flag existed carry the bare fraction: flagged here too)."""
    v = combo.get(f"{phase}_vs_fio")
    if combo.get(f"{phase}_fio_error") or (v is not None and v > 1.0):
        return "no limit (>1)"
    return "-" if v is None else f"{v:.2f}"

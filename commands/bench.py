"""`proxytune bench`: the microbenchmarks (event mechanisms, comm_select, object stores, a real proxy)."""

from pathlib import Path

import click

from proxytune.core.invocation import require_root
from proxytune import proxies as proxy_kinds

from .options import complete_profiles
from .output import finish_bench


@click.group()
def bench():
    """Microbenchmarks that reproduce the classic proxy results on this kernel.

    \b
    Examples:
      proxytune bench events --quick                select/poll/epoll/io_uring in about 15 s
      proxytune bench storage --quick               ufs vs largefile vs rawdev (as root)
    """


@bench.command("events")
@click.option("--quick", is_flag=True, help="A small grid (about 15 s); the full sweep is what docs/BENCHMARKS.md quotes.")
@click.option("--backend", "backends", multiple=True, metavar="NAME",
              help="Only these mechanisms (select, poll, epoll, io_uring, io_uring-multishot, kqueue).")
@click.option("--pin", type=int, metavar="CPU", help="Pin the harness to one CPU.")
@click.option("--tcp", is_flag=True, help="TCP loopback connections instead of socketpairs.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Result JSON file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result JSON.")
def bench_events(quick, backends, pin, tcp, output, as_json):
    """select / poll / epoll / io_uring / kqueue: cost per wait against idle descriptors.

    \b
    Sweeps N idle descriptors (1..10,000) with K ready (hot: the same K;
    cold: rotating), then registration churn, events per call as load rises
    (Mogul's batching), libevent's bench workload, and perf's epoll
    benchmark as an outside reference. Each point: warm-up, >= 5 repetitions,
    median and spread; points taken while the machine was busy are flagged.

    \b
    Examples:
      proxytune bench events --quick
      proxytune bench events --backend epoll --backend io_uring --pin 2 -o events.json
    """
    from proxytune.microbench import events
    data = events.run(quick=quick, backends=list(backends), pin=pin, tcp=tcp, quiet=as_json)
    finish_bench(data, "events", output, as_json)


@bench.command("fdscan")
@click.option("--quick", is_flag=True, help="Three table sizes (a few seconds).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Result JSON file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result JSON.")
def bench_fdscan(quick, output, as_json):
    """Mogul's comm_select study: five ways to build select()'s interest sets.

    \b
    1 fd table of Squid-like entries, the 3 fields on 3 cache lines
    2 the 3 fields adjacent   3 a separate compact array of the 3 fields
    4 long-lived bitmaps      5 bitmaps + word-at-a-time result scan
    D1 misses per call from hardware counters, else cachegrind (D1 32K/8/64).

    \b
    Examples:
      proxytune bench fdscan --quick
    """
    from proxytune.microbench import fdscan
    finish_bench(fdscan.run(quick=quick, quiet=as_json), "fdscan", output, as_json)


@bench.command("storage")
@click.option("--quick", is_flag=True, help="ext4 only, 32 MiB cache, one repetition a cell and 3 alternating rounds of the report's seed cells (about 1 minute); the report runs those seed cells alone.")
@click.option("--fs", "fss", metavar="LIST", help="Filesystems to make and test, e.g. ext4,xfs [ext2,ext4,xfs,btrfs].")
@click.option("--engine", "engines", multiple=True, type=click.Choice(["sync", "threads", "posix-aio", "io_uring"]),
              help="Only these I/O engines (repeatable).")
@click.option("--device", metavar="DEV", help="Block device for rawdev [a loop device over a sparse file]. "
              "Refused unless unused and blank (signatures, and reads across it); held O_EXCL during the run.")
@click.option("--force-destroy-data", is_flag=True,
              help="Let --device be used although it carries a signature or non-zero data. Destroys its data. "
                   "A mounted, swap or held device is refused even so.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Result JSON file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result JSON.")
def bench_storage(quick, fss, engines, device, force_destroy_data, output, as_json):
    """ufs vs largefile vs rawdev, with sync / threads / POSIX AIO / io_uring.

    \b
    The 2002 Squid paper's question on today's kernel: one file per object
    (ufs) against one log-structured large file or a raw device, under the
    PolyMix-3 content mix. Per filesystem (made on a loop device, relatime
    and noatime): fill twice the cache (final sync timed), then a steady
    hit/miss mix, then hits alone, each from a cold page cache. Metrics:
    objects/s, MB/s, latency percentiles, syscalls per object (counted with
    perf), CPU per object, hit ratio, device writes; fio gives the limit.
    Needs root (loop devices, mounts).

    \b
    Examples (as root):
      proxytune bench storage --quick
      proxytune bench storage --fs ext4,xfs --engine io_uring --engine sync -o storage.json
    """
    from proxytune.microbench import storage
    require_root("it makes loop devices and mounts them")
    data = storage.run(quick=quick, fss=storage.filesystems(fss), device=device, force=force_destroy_data,
                       engines=list(engines) or None, quiet=as_json)
    finish_bench(data, "storage", output, as_json)


@bench.command("proxy")
@click.option("--quick", is_flag=True, help="8 s fill + 12 s steady per store, 100 connections (about 2 minutes).")
@click.option("--proxy", "proxies", multiple=True,
              type=click.Choice(proxy_kinds.names() + ["all"]),
              help="Proxy to start from Debian's package (repeatable; all = every one, every store) [squid].")
@click.option("--store", "stores", multiple=True,
              type=click.Choice([s for k in proxy_kinds.KINDS for s in k.stores + k.optional_stores]),
              help="Store (repeatable): " + ", ".join(f"{k.kind} {'/'.join(k.stores + k.optional_stores)}"
                                                       for k in proxy_kinds.KINDS) + " [every store of each proxy].")
@click.option("--concurrency", type=click.IntRange(1, 20000), metavar="N", help="wrk connections [100, full 200; with --compare-profile 400, full 600].")
@click.option("--idle", type=click.IntRange(0, 20000), metavar="N",
              help="Idle keep-alive client connections during steady [200, full 1000; --compare-profile 1000].")
@click.option("--target", metavar="HOST:PORT",
              help="Load a proxy you run instead of starting squid (it must reach 127.0.0.1, our origin).")
@click.option("--compare-profile", metavar="NAME|PATH", shell_complete=complete_profiles,
              help="Run before and after applying this profile (journaled, rolled back after).")
@click.option("--only", multiple=True, metavar="GLOB", help="With --compare-profile: only these settings.")
@click.option("--skip", multiple=True, metavar="GLOB", help="With --compare-profile: leave these out.")
@click.option("--yes", "-y", is_flag=True, help="With --compare-profile: change the host without asking.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Result JSON file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result JSON.")
@click.pass_obj
def bench_proxy(host, quick, proxies, stores, concurrency, idle, target, compare_profile, only, skip, yes, output,
                as_json):
    """A real proxy (Squid unless --proxy) under a PolyMix-like load through wrk.

    \b
    Starts an nginx origin with PolyMix-3 sized objects and the proxy
    (Debian's package, generated config, own temp dir) per store; wrk sends
    absolute-URI requests whose recurrence gives about 55% hits, while a
    helper holds idle keep-alive clients. Fill, then steady (measured):
    throughput, latency of hits and misses (a sequential probe), hit ratio
    from the proxy's own log or counters (else X-Cache), syscalls and
    device writes per request, errors by kind. Everything started is
    stopped. --proxy all: every proxy and store in one run (the storage
    question on real caches).

    \b
    --compare-profile linux/proxy: the same load as the host is, then with
    the profile applied (the proxy restarted with the service's new
    LimitNOFILE), then rolled back. Needs --yes.

    \b
    Examples (as root):
      proxytune bench proxy --quick
      proxytune bench proxy --proxy nginx --store proxy_cache --concurrency 200
      proxytune bench proxy --compare-profile linux/squid --yes
      proxytune bench proxy --target 127.0.0.1:3128   a proxy you run (no root needed)
    """
    from proxytune.microbench import proxybench
    proxybench.refuse_bad_request(target, compare_profile, stores, proxies, yes)
    if compare_profile:
        data = proxybench.compare_profile(host, compare_profile, (stores or (None,))[0], quick, concurrency,
                                          idle, only, skip, as_json, proxy=(proxies or ("squid",))[0])
    else:
        data = proxybench.run(quick, list(stores) or None, concurrency, idle, None, as_json, target=target,
                              proxies=list(proxies) or None)
    finish_bench(data, "proxy", output, as_json)

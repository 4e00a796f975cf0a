/* objbench driver: run one phase of the cache workload on one store with
 * one engine, keeping `depth` operations in flight.
 *   fill    write new objects until twice the capacity has been written
 *           (an empty cache flatters every store); the final syncfs or
 *           fdatasync is inside the timed region, so the data reached the disk
 *   steady  Zipf-popular requests over twice the cached objects: hits are
 *           reads, misses are writes with eviction
 *   hit     the same popularity, cached objects only: reads alone, so what a
 *           read costs besides the read (atime updates) shows
 * The index is saved between phases, so each phase is its own process and
 * can be counted from outside (perf stat -e raw_syscalls:sys_enter).
 * Output: one JSON document.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "objbench.h"

static struct bench B;

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static double cpu_ns(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e9 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e3;
}

void bench_fail(const char *what, int err)
{
    printf("{\"harness\": \"objbench\", \"error\": \"%s: %s\"}\n", what, strerror(err));
    exit(1);
}

static void complete(struct bench *b, struct op *op)
{
    double lat = now_ns() - op->t_submit;
    if (b->nlat == b->latcap) {
        b->latcap *= 2;
        b->lat = realloc(b->lat, b->latcap * sizeof(double));
    }
    b->lat[b->nlat++] = lat;
    b->io_ops++;
    int data = op->kind == OP_FILE_READ || op->kind == OP_PREAD || op->kind == OP_FILE_WRITE || op->kind == OP_PWRITE;
    if (op->result < 0 || (data && (size_t)op->result < op->len && op->kind != OP_FILE_READ)) {
        b->errors++;
    } else if (op->kind == OP_FILE_READ || op->kind == OP_PREAD) {
        b->bytes_moved += op->obj_len;
        if ((size_t)op->result < op->obj_skip + op->obj_len ||
            (b->verify && !check_content(op->buf + op->obj_skip, op->id, op->obj_len)))
            b->bad_reads++;
    } else if (op->kind == OP_FILE_WRITE) {
        b->bytes_moved += op->obj_len;
    }
    b->store->completed(b, op);
    b->free_bufs[b->nfree++] = op->slot;
    b->inflight--;
}

int bench_drain(struct bench *b, int until_inflight)
{
    struct op *done[64];
    while (b->inflight > until_inflight) {
        int n = b->engine->reap(b->eng, done, 1, 64);
        if (n < 0)
            bench_fail("reap", -n);
        for (int i = 0; i < n; i++)
            complete(b, done[i]);
    }
    return 0;
}

int bench_take_buffer(struct bench *b)
{
    while (!b->nfree)
        bench_drain(b, b->inflight - 1);
    return b->free_bufs[--b->nfree];
}

int bench_submit(struct bench *b, struct op *op)
{
    struct op *slot = &b->ops[op->slot];
    *slot = *op;
    slot->t_submit = now_ns();
    b->inflight++;
    int rc = b->engine->submit(b->eng, slot);
    if (rc)
        bench_fail("submit", -rc);
    if (b->inflight >= b->depth)          /* keep at most depth in flight */
        bench_drain(b, b->depth - 1);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *sorted, size_t n, double p)
{
    if (!n)
        return 0;
    size_t i = (size_t)(p * (n - 1) + 0.5);
    return sorted[i];
}

static const struct store *STORES[] = { &store_ufs, &store_largefile, &store_rawdev };
static const struct engine *ENGINES[] = { &eng_sync, &eng_threads, &eng_aio, &eng_uring };

static void unavailable(const char *store, const char *engine, const char *why)
{
    printf("{\"harness\": \"objbench\", \"version\": 1, \"store\": \"%s\", \"engine\": \"%s\", "
           "\"available\": false, \"reason\": \"%s\"}\n", store, engine, why);
}

int main(int argc, char **argv)
{
    const char *store = "ufs", *engine = "sync", *phase = "fill";
    long capacity_mb = 64, requests = 20000, threads = 16;
    double alpha = 0.8;
    struct bench *b = &B;
    b->depth = 16;
    b->seed = 1;
    static struct option longs[] = {
        {"store", 1, 0, 's'}, {"engine", 1, 0, 'e'}, {"phase", 1, 0, 'p'}, {"path", 1, 0, 'P'},
        {"state", 1, 0, 'S'}, {"capacity-mb", 1, 0, 'c'}, {"requests", 1, 0, 'r'}, {"depth", 1, 0, 'd'},
        {"threads", 1, 0, 't'}, {"seed", 1, 0, 'x'}, {"zipf", 1, 0, 'z'}, {"verify", 0, 0, 'v'}, {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 's': store = optarg; break;
        case 'e': engine = optarg; break;
        case 'p': phase = optarg; break;
        case 'P': b->path = optarg; break;
        case 'S': b->state = optarg; break;
        case 'c': capacity_mb = atol(optarg); break;
        case 'r': requests = atol(optarg); break;
        case 'd': b->depth = atoi(optarg); break;
        case 't': threads = atol(optarg); break;
        case 'x': b->seed = strtoull(optarg, NULL, 10); break;
        case 'z': alpha = atof(optarg); break;
        case 'v': b->verify = 1; break;
        default:
            fprintf(stderr, "usage: objbench --store ufs|largefile|rawdev --engine sync|threads|posix-aio|io_uring "
                            "--phase fill|steady|hit --path P [--state FILE] [--capacity-mb MB] [--requests R] "
                            "[--depth D (1-4096)] [--threads T] [--seed S] [--zipf A] [--verify]\n");
            return 2;
        }
    }
    int fill = strcmp(phase, "fill") == 0, hit_only = strcmp(phase, "hit") == 0;
    for (size_t i = 0; i < sizeof STORES / sizeof *STORES; i++)
        if (strcmp(STORES[i]->name, store) == 0)
            b->store = STORES[i];
    for (size_t i = 0; i < sizeof ENGINES / sizeof *ENGINES; i++)
        if (strcmp(ENGINES[i]->name, engine) == 0)
            b->engine = ENGINES[i];
    if (!b->store || !b->engine || !b->path || b->depth < 1 || b->depth > 4096 || capacity_mb < 4 || threads < 1 ||
        (!fill && !hit_only && strcmp(phase, "steady")) || (b->store != &store_ufs && !b->state)) {
        fprintf(stderr, "objbench: bad arguments (see --help)\n");
        return 2;
    }
    const char *why = b->engine->unavailable();
    if (!why)
        why = b->engine->unsupported(b->store == &store_ufs ? OP_FILE_WRITE : OP_PWRITE);
    if (why) {
        unavailable(store, engine, why);
        return 0;
    }
    if (b->engine == &eng_sync)
        b->depth = 1;
    b->capacity = (uint64_t)capacity_mb << 20;
    index_init(&b->ix, b->capacity / 512 + 65536);
    int nbufs = b->depth + 2;
    b->bufs = calloc(nbufs, sizeof(char *));
    b->free_bufs = calloc(nbufs, sizeof(int));
    b->ops = calloc(nbufs, sizeof(struct op));
    for (int i = 0; i < nbufs; i++) {
        if (posix_memalign((void **)&b->bufs[i], ALIGN, MAX_OBJECT + 2 * ALIGN))
            bench_fail("posix_memalign", ENOMEM);
        b->free_bufs[b->nfree++] = i;
    }
    b->latcap = 1 << 16;
    b->lat = malloc(b->latcap * sizeof(double));
    int rc = b->store->open(b, fill);
    if (rc)
        bench_fail(fill ? "open store" : "open store (run the fill phase first)", -rc);
    b->eng = b->engine->create(b->dirfd, b->depth, (int)threads);
    if (!b->eng)
        bench_fail("engine create", ENOMEM);

    uint64_t rng = b->seed * 7919 + 17, requests_done = 0;
    struct zipf *z = NULL;
    uint64_t universe = 0;
    if (!fill) {
        universe = 2 * (b->ix.objects ? b->ix.objects : 1);
        z = zipf_new(universe, alpha);
    }
    double c0 = cpu_ns(), t0 = now_ns();
    if (fill) {
        uint64_t written = 0;
        while (written < 2 * b->capacity) {
            uint64_t id = b->persist.next_id++;
            size_t size = object_size(id, b->seed);
            if ((rc = b->store->miss(b, id, size)))
                bench_fail("miss", -rc);
            written += size;
            b->misses++;
            requests_done++;
        }
    } else {
        for (long r = 0; r < requests; r++) {
            uint64_t rank = zipf_draw(z, &rng), id;
            id = rank < b->persist.next_id ? b->persist.next_id - 1 - rank : b->persist.next_id++;
            int64_t pos = index_find(&b->ix, id);
            if (hit_only && pos < 0) {           /* the hit phase: only cached objects */
                if (!b->ix.objects)
                    break;
                r--;
                continue;
            }
            if (pos >= 0) {
                b->hits++;
                rc = b->store->hit(b, pos);
            } else {
                b->misses++;
                rc = b->store->miss(b, id, object_size(id, b->seed));
            }
            if (rc)
                bench_fail(pos >= 0 ? "hit" : "miss", -rc);
            requests_done++;
        }
    }
    bench_drain(b, 0);
    if ((rc = b->store->sync(b)))
        bench_fail("sync", -rc);
    double wall = now_ns() - t0, cpu = cpu_ns() - c0;
    if ((rc = b->store->save(b)))
        bench_fail("save index", errno);
    qsort(b->lat, b->nlat, sizeof(double), cmp_double);
    printf("{\"harness\": \"objbench\", \"version\": 1, \"store\": \"%s\", \"engine\": \"%s\", \"phase\": \"%s\", "
           "\"available\": true, \"params\": {\"capacity_mb\": %ld, \"depth\": %d, \"threads\": %ld, "
           "\"requests\": %ld, \"seed\": %llu, \"zipf\": %.2f, \"verify\": %s, \"universe\": %llu}, ",
           store, engine, phase, capacity_mb, b->depth, threads, requests, (unsigned long long)b->seed, alpha,
           b->verify ? "true" : "false", (unsigned long long)universe);
    printf("\"requests\": %llu, \"hits\": %llu, \"misses\": %llu, \"memory_hits\": %llu, \"evictions\": %llu, "
           "\"io_ops\": %llu, \"errors\": %llu, \"bad_reads\": %llu, \"bytes\": %llu, \"wall_s\": %.4f, "
           "\"cpu_s\": %.4f, \"objects_per_s\": %.1f, \"mb_per_s\": %.2f, \"cpu_us_per_object\": %.2f, "
           "\"hit_ratio\": %.4f, \"latency_us\": {\"p50\": %.1f, \"p99\": %.1f, \"p999\": %.1f, \"max\": %.1f}, "
           "\"cached_objects\": %llu, \"cached_mb\": %.1f}\n",
           (unsigned long long)requests_done, (unsigned long long)b->hits, (unsigned long long)b->misses,
           (unsigned long long)b->mem_hits, (unsigned long long)b->evictions, (unsigned long long)b->io_ops,
           (unsigned long long)b->errors, (unsigned long long)b->bad_reads, (unsigned long long)b->bytes_moved,
           wall / 1e9, cpu / 1e9, requests_done / (wall / 1e9), b->bytes_moved / (wall / 1e9) / 1048576.0,
           cpu / 1e3 / (requests_done ? requests_done : 1),
           (b->hits + b->misses) ? (double)b->hits / (b->hits + b->misses) : 0.0,
           pct(b->lat, b->nlat, 0.5) / 1e3, pct(b->lat, b->nlat, 0.99) / 1e3, pct(b->lat, b->nlat, 0.999) / 1e3,
           b->nlat ? b->lat[b->nlat - 1] / 1e3 : 0.0, (unsigned long long)b->ix.objects, b->ix.bytes / 1048576.0);
    b->engine->destroy(b->eng);
    return b->errors || b->bad_reads ? 3 : 0;
}

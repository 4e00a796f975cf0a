/* ufs: one file per object in a Squid-style L1/L2 tree (16 x 256): a miss
 * is open/write/close of a new file, a hit open/read/close, an eviction
 * unlink. Objects are evicted oldest first between the high and low water
 * marks. Durability at the end of a phase: syncfs. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "objbench.h"

#define L1 16
#define L2 256

static void path_of(uint64_t fn, char *out)      /* Squid's storeUfsDirFullPath layout */
{
    snprintf(out, 32, "%02X/%02X/%08llX", (unsigned)((fn / L2 / L2) % L1), (unsigned)((fn / L2) % L2),
             (unsigned long long)fn);
}

static int ufs_open(struct bench *b, int fresh)
{
    b->dirfd = open(b->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (b->dirfd < 0)
        return -errno;
    if (fresh) {
        char d[16];
        for (int i = 0; i < L1; i++) {
            snprintf(d, sizeof d, "%02X", i);
            mkdirat(b->dirfd, d, 0755);
            for (int j = 0; j < L2; j++) {
                snprintf(d, sizeof d, "%02X/%02X", i, j);
                mkdirat(b->dirfd, d, 0755);
            }
        }
        return 0;
    }
    char p[4096];
    snprintf(p, sizeof p, "%s/swap.state", b->path);
    return index_load(&b->ix, p, &b->persist, sizeof b->persist) ? -ENOENT : 0;
}

static int evict_to_low_water(struct bench *b)
{
    if (b->ix.bytes <= HIGH_WATER * b->capacity)
        return 0;
    while (b->ix.bytes > LOW_WATER * b->capacity) {
        int64_t pos;
        struct entry *e = index_oldest(&b->ix, &pos);
        if (!e)
            break;
        if (e->pending || e->readers) {   /* in flight: a pool thread could unlink before it opens */
            bench_drain(b, b->inflight - 1);
            continue;
        }
        int slot = bench_take_buffer(b);
        struct op op = { .kind = OP_UNLINK, .stripe = -1, .slot = slot };
        path_of(e->loc, op.path);
        index_kill(&b->ix, pos);
        index_pop(&b->ix);
        b->evictions++;
        int rc = bench_submit(b, &op);
        if (rc)
            return rc;
    }
    return 0;
}

static int ufs_miss(struct bench *b, uint64_t id, size_t size)
{
    int rc = evict_to_low_water(b);
    if (rc)
        return rc;
    int slot = bench_take_buffer(b);
    struct op op = { .kind = OP_FILE_WRITE, .id = id, .len = size, .obj_len = size, .stripe = -1, .slot = slot };
    uint64_t fn = b->persist.next_fn++;
    path_of(fn, op.path);
    op.buf = b->bufs[slot];
    fill_content(op.buf, id, size);
    int64_t pos = index_add(&b->ix, id, fn, (uint32_t)size);
    if (pos < 0)
        return -ENOSPC;
    b->ix.ring[pos].pending = 1;
    op.off = pos;                         /* remembered to clear pending on completion */
    return bench_submit(b, &op);
}

static int ufs_hit(struct bench *b, int64_t pos)
{
    struct entry *e = &b->ix.ring[pos];
    if (e->pending) {
        b->mem_hits++;                    /* still being written: served from memory */
        return 0;
    }
    int slot = bench_take_buffer(b);
    struct op op = { .kind = OP_FILE_READ, .id = e->id, .len = e->size, .obj_len = e->size, .stripe = -1,
                     .slot = slot, .buf = b->bufs[slot], .off = pos };   /* off: whose read ends */
    path_of(e->loc, op.path);
    e->readers++;
    return bench_submit(b, &op);
}

static void ufs_completed(struct bench *b, struct op *op)
{
    if (op->kind == OP_FILE_WRITE && b->ix.ring[op->off].id == op->id)
        b->ix.ring[op->off].pending = 0;
    else if (op->kind == OP_FILE_READ)    /* a read entry cannot be evicted, so off still holds it */
        b->ix.ring[op->off].readers--;
}

static int ufs_sync(struct bench *b)
{
    return syncfs(b->dirfd) ? -errno : 0;
}

static int ufs_save(struct bench *b)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/swap.state", b->path);
    return index_save(&b->ix, p, &b->persist, sizeof b->persist);
}

const struct store store_ufs = { "ufs", ufs_open, ufs_miss, ufs_hit, ufs_completed, ufs_sync, ufs_save };

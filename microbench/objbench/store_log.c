/* largefile and rawdev: one log-structured region, as coss and rock do.
 * Objects are packed into 1 MiB stripes in memory and written a stripe at a
 * time; the in-memory index maps each object to its offset; a hit is one
 * pread. When the log wraps, the stripe about to be overwritten is evicted
 * (oldest first). largefile: a preallocated regular file, buffered I/O.
 * rawdev: a block device with O_DIRECT and aligned buffers; the first 10 KB
 * are reserved for a header, as in the 2002 paper (the log starts at 12 KiB,
 * the next 4 KiB boundary). Durability at the end of a phase: fdatasync. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "objbench.h"

#define HEADER_RESERVED 10240

static int stripe_of(struct bench *b, uint64_t off)
{
    return (int)((off - b->log_start) / STRIPE);
}

static int log_open(struct bench *b, int fresh, int raw)
{
    b->fd = open(b->path, O_RDWR | O_CLOEXEC | (raw ? O_DIRECT : O_CREAT), 0644);
    if (b->fd < 0)
        return -errno;
    uint64_t size = b->capacity;
    if (raw) {
        uint64_t dev = 0;
        if (ioctl(b->fd, BLKGETSIZE64, &dev) < 0)
            return -errno;
        if (dev < size)
            size = dev;
        b->log_start = (HEADER_RESERVED + ALIGN - 1) / ALIGN * ALIGN;
    } else if (fresh) {
        int rc = posix_fallocate(b->fd, 0, (off_t)size);
        if (rc)
            return -rc;
        b->log_start = 0;
    }
    b->nstripes = (size - b->log_start) / STRIPE;
    if (b->nstripes < 2)
        return -ENOSPC;
    b->log_end = b->log_start + b->nstripes * STRIPE;
    b->stripe_reads = calloc(b->nstripes, sizeof(int));
    b->stripe_writes = calloc(b->nstripes, sizeof(int));
    b->stripe_slot = -1;
    if (!fresh && index_load(&b->ix, b->state, &b->persist, sizeof b->persist))
        return -ENOENT;
    if (fresh)
        b->persist.head = b->log_start;
    return 0;
}

static int largefile_open(struct bench *b, int fresh) { return log_open(b, fresh, 0); }
static int rawdev_open(struct bench *b, int fresh) { return log_open(b, fresh, 1); }

/* write the stripe being filled (padded to full size) and start the next */
static int flush_stripe(struct bench *b)
{
    if (b->stripe_slot < 0)
        return 0;
    struct op op = { .kind = OP_PWRITE, .fd = b->fd, .buf = b->bufs[b->stripe_slot], .len = STRIPE,
                     .off = (off_t)b->stripe_off, .stripe = stripe_of(b, b->stripe_off), .slot = b->stripe_slot };
    memset(op.buf + b->stripe_fill, 0, STRIPE - b->stripe_fill);
    b->stripe_writes[op.stripe]++;
    b->stripe_slot = -1;
    return bench_submit(b, &op);
}

static int open_stripe(struct bench *b)
{
    uint64_t off = b->persist.head;
    int s = stripe_of(b, off);
    while (b->stripe_reads[s] || b->stripe_writes[s])     /* never overwrite what is in flight */
        bench_drain(b, b->inflight - 1);
    int64_t pos;                                          /* evict what the stripe held */
    struct entry *e;
    while ((e = index_oldest(&b->ix, &pos)) && e->loc >= off && e->loc < off + STRIPE) {
        index_kill(&b->ix, pos);
        index_pop(&b->ix);
        b->evictions++;
    }
    b->stripe_slot = bench_take_buffer(b);
    b->stripe_off = off;
    b->stripe_fill = 0;
    b->persist.head = off + STRIPE >= b->log_end ? b->log_start : off + STRIPE;
    return 0;
}

static int log_miss(struct bench *b, uint64_t id, size_t size)
{
    int rc;
    if (b->stripe_slot >= 0 && b->stripe_fill + size > STRIPE && (rc = flush_stripe(b)))
        return rc;
    if (b->stripe_slot < 0 && (rc = open_stripe(b)))
        return rc;
    fill_content(b->bufs[b->stripe_slot] + b->stripe_fill, id, size);
    if (index_add(&b->ix, id, b->stripe_off + b->stripe_fill, (uint32_t)size) < 0)
        return -ENOSPC;
    b->stripe_fill += (size + 7) & ~(size_t)7;
    b->bytes_moved += size;
    return 0;
}

static int log_hit(struct bench *b, int64_t pos)
{
    struct entry *e = &b->ix.ring[pos];
    int s = stripe_of(b, e->loc);
    if ((b->stripe_slot >= 0 && e->loc >= b->stripe_off && e->loc < b->stripe_off + STRIPE) || b->stripe_writes[s]) {
        b->mem_hits++;                      /* in the stripe being filled or written */
        return 0;
    }
    uint64_t start = e->loc & ~(uint64_t)(ALIGN - 1);
    uint64_t end = (e->loc + e->size + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
    int slot = bench_take_buffer(b);
    struct op op = { .kind = OP_PREAD, .fd = b->fd, .buf = b->bufs[slot], .len = end - start, .off = (off_t)start,
                     .id = e->id, .obj_len = e->size, .obj_skip = e->loc - start, .stripe = s, .slot = slot };
    b->stripe_reads[s]++;
    return bench_submit(b, &op);
}

static void log_completed(struct bench *b, struct op *op)
{
    if (op->kind == OP_PREAD)
        b->stripe_reads[op->stripe]--;
    else if (op->kind == OP_PWRITE)
        b->stripe_writes[op->stripe]--;
}

static int log_sync(struct bench *b)
{
    int rc = flush_stripe(b);
    if (rc)
        return rc;
    bench_drain(b, 0);
    return fdatasync(b->fd) ? -errno : 0;
}

static int log_save(struct bench *b)
{
    return index_save(&b->ix, b->state, &b->persist, sizeof b->persist);
}

const struct store store_largefile = {
    "largefile", largefile_open, log_miss, log_hit, log_completed, log_sync, log_save,
};
const struct store store_rawdev = {
    "rawdev", rawdev_open, log_miss, log_hit, log_completed, log_sync, log_save,
};

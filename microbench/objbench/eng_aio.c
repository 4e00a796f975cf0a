/* POSIX AIO (aio_read/aio_write/aio_suspend). It moves data only: there is
 * no asynchronous open, close or unlink, so a file-per-object store cannot
 * use it for what dominates its cost (which is why Squid's aufs uses threads).
 * On glibc, POSIX AIO is itself a user-space thread pool. */
#define _GNU_SOURCE
#include <aio.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "objbench.h"

struct aio_eng {
    int depth, n;
    struct aiocb *cbs;
    struct op **ops;            /* slot -> op, NULL when free */
};

static void *create(int dirfd, int depth, int threads)
{
    (void)dirfd; (void)threads;
    struct aio_eng *e = calloc(1, sizeof *e);
    e->depth = depth;
    e->cbs = calloc(depth, sizeof *e->cbs);
    e->ops = calloc(depth, sizeof *e->ops);
    return e;
}

static int submit(void *p, struct op *op)
{
    struct aio_eng *e = p;
    int slot = 0;
    while (e->ops[slot])
        slot++;
    struct aiocb *cb = &e->cbs[slot];
    memset(cb, 0, sizeof *cb);
    cb->aio_fildes = op->fd;
    cb->aio_buf = op->buf;
    cb->aio_nbytes = op->len;
    cb->aio_offset = op->off;
    int rc = op->kind == OP_PWRITE ? aio_write(cb) : aio_read(cb);
    if (rc)
        return -errno;
    e->ops[slot] = op;
    e->n++;
    return 0;
}

static int reap(void *p, struct op **done, int min, int max)
{
    struct aio_eng *e = p;
    int n = 0;
    const struct aiocb **wait = malloc(e->depth * sizeof *wait);
    for (;;) {
        int pending = 0;
        for (int s = 0; s < e->depth && n < max; s++) {
            if (!e->ops[s])
                continue;
            int err = aio_error(&e->cbs[s]);
            if (err == EINPROGRESS) {
                wait[pending++] = &e->cbs[s];
                continue;
            }
            ssize_t r = aio_return(&e->cbs[s]);
            e->ops[s]->result = err ? -err : r;
            done[n++] = e->ops[s];
            e->ops[s] = NULL;
            e->n--;
        }
        if (n >= min || !pending)
            break;
        aio_suspend(wait, pending, NULL);
    }
    free(wait);
    return n;
}

static void destroy(void *p)
{
    struct aio_eng *e = p;
    free(e->cbs); free(e->ops); free(e);
}

static const char *none(void) { return NULL; }

static const char *data_only(enum op_kind k)
{
    return k == OP_PWRITE || k == OP_PREAD ? NULL
           : "POSIX AIO has no asynchronous open, close or unlink (Squid's aufs uses threads for that)";
}

const struct engine eng_aio = { "posix-aio", none, data_only, create, submit, reap, destroy };

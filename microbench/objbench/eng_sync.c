/* sync: each operation runs to completion in the calling thread (Squid's ufs). */
#define _GNU_SOURCE
#include <stdlib.h>

#include "objbench.h"

struct sync_eng {
    int dirfd, n;
    struct op **done;
};

static void *create(int dirfd, int depth, int threads)
{
    (void)threads;
    struct sync_eng *e = calloc(1, sizeof *e);
    e->dirfd = dirfd;
    e->done = calloc(depth + 1, sizeof *e->done);
    return e;
}

static int submit(void *p, struct op *op)
{
    struct sync_eng *e = p;
    op_run_blocking(e->dirfd, op);
    e->done[e->n++] = op;
    return 0;
}

static int reap(void *p, struct op **done, int min, int max)
{
    (void)min;
    struct sync_eng *e = p;
    int n = 0;
    while (e->n && n < max)
        done[n++] = e->done[--e->n];
    return n;
}

static void destroy(void *p)
{
    struct sync_eng *e = p;
    free(e->done);
    free(e);
}

static const char *none(void) { return NULL; }
static const char *all_ops(enum op_kind k) { (void)k; return NULL; }

const struct engine eng_sync = { "sync", none, all_ops, create, submit, reap, destroy };

/* io_uring: data operations are one request each; a file-per-object
 * operation is a chain of requests driven by completions:
 * OPENAT -> WRITE/READ -> CLOSE, or one UNLINKAT. */
#define _GNU_SOURCE
#include <stddef.h>

#include "objbench.h"

#ifdef HAVE_LIBURING
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ST_OPEN, ST_IO, ST_CLOSE };

struct uring_eng {
    struct io_uring ring;
    int dirfd;
};

static struct io_uring_sqe *sqe(struct uring_eng *e)
{
    struct io_uring_sqe *s = io_uring_get_sqe(&e->ring);
    if (!s) {
        io_uring_submit(&e->ring);
        s = io_uring_get_sqe(&e->ring);
    }
    return s;
}

static void *create(int dirfd, int depth, int threads)
{
    (void)threads;
    struct uring_eng *e = calloc(1, sizeof *e);
    e->dirfd = dirfd;
    if (io_uring_queue_init(depth < 8 ? 8 : depth * 2, &e->ring, 0) < 0) {
        free(e);
        return NULL;
    }
    return e;
}

static void queue_step(struct uring_eng *e, struct op *op)
{
    struct io_uring_sqe *s = sqe(e);
    switch (op->kind) {
    case OP_PWRITE:
        io_uring_prep_write(s, op->fd, op->buf, op->len, op->off);
        break;
    case OP_PREAD:
        io_uring_prep_read(s, op->fd, op->buf, op->len, op->off);
        break;
    case OP_UNLINK:
        io_uring_prep_unlinkat(s, e->dirfd, op->path, 0);
        break;
    case OP_FILE_WRITE:
    case OP_FILE_READ:
        if (op->state == ST_OPEN)
            io_uring_prep_openat(s, e->dirfd, op->path,
                                 op->kind == OP_FILE_WRITE ? O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC
                                                           : O_RDONLY | O_CLOEXEC, 0644);
        else if (op->state == ST_IO && op->kind == OP_FILE_WRITE)
            io_uring_prep_write(s, op->tmpfd, op->buf, op->len, 0);
        else if (op->state == ST_IO)
            io_uring_prep_read(s, op->tmpfd, op->buf, op->len, 0);
        else
            io_uring_prep_close(s, op->tmpfd);
        break;
    }
    io_uring_sqe_set_data(s, op);
}

static int submit(void *p, struct op *op)
{
    struct uring_eng *e = p;
    op->state = ST_OPEN;
    op->tmpfd = -1;
    queue_step(e, op);
    int rc = io_uring_submit(&e->ring);
    return rc < 0 ? rc : 0;
}

/* advance a chain on one completion; 1 when the whole operation is done */
static int advance(struct uring_eng *e, struct op *op, int res)
{
    if (op->kind == OP_PWRITE || op->kind == OP_PREAD || op->kind == OP_UNLINK) {
        op->result = res;
        return 1;
    }
    if (op->state == ST_OPEN) {
        if (res < 0) {
            op->result = res;
            return 1;
        }
        op->tmpfd = res;
        op->state = ST_IO;
    } else if (op->state == ST_IO) {
        op->result = res;
        op->state = ST_CLOSE;
    } else {
        return 1;               /* closed; result kept from the I/O step */
    }
    queue_step(e, op);
    return 0;
}

static int reap(void *p, struct op **done, int min, int max)
{
    struct uring_eng *e = p;
    int n = 0;
    while (n < max) {
        struct io_uring_cqe *cqe;
        int rc = n < min ? io_uring_submit_and_wait(&e->ring, 1) : io_uring_submit(&e->ring);
        if (rc < 0 && rc != -EINTR)
            return rc;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&e->ring, head, cqe) {
            seen++;
            struct op *op = io_uring_cqe_get_data(cqe);
            if (advance(e, op, cqe->res))
                done[n++] = op;
            if (n >= max)
                break;
        }
        io_uring_cq_advance(&e->ring, seen);
        if (n >= min && !seen)
            break;
        if (n >= min && io_uring_cq_ready(&e->ring) == 0)
            break;
    }
    io_uring_submit(&e->ring);
    return n;
}

static void destroy(void *p)
{
    struct uring_eng *e = p;
    io_uring_queue_exit(&e->ring);
    free(e);
}

static const char *probe(void)
{
    static char why[128];
    struct io_uring r;
    int rc = io_uring_queue_init(4, &r, 0);
    if (rc < 0) {
        snprintf(why, sizeof why, "io_uring_setup failed: %s", strerror(-rc));
        return why;
    }
    io_uring_queue_exit(&r);
    return NULL;
}

static const char *all_ops(enum op_kind k) { (void)k; return NULL; }

const struct engine eng_uring = { "io_uring", probe, all_ops, create, submit, reap, destroy };
#else
static const char *no_liburing(void)
{
    return "built without liburing (Debian: apt-get install liburing-dev, then rebuild)";
}

const struct engine eng_uring = { "io_uring", no_liburing, NULL, NULL, NULL, NULL, NULL };
#endif

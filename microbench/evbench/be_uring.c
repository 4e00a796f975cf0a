/* io_uring poll requests (liburing).
 *
 * "io_uring": one-shot IORING_OP_POLL_ADD per descriptor, re-armed at the
 * start of the next wait after it fires; a ready descriptor completes at
 * re-arm, which gives level-triggered behaviour like poll and epoll.
 * "io_uring-multishot": one multishot poll per descriptor (kernel >= 5.13),
 * posting a completion on every new readiness event: edge-triggered, so
 * it has no equivalent of a descriptor that simply stays ready.
 * Deregistration is IORING_OP_POLL_REMOVE; its completion and the
 * cancelled poll's are reaped before del returns, so the ring stays clean.
 */
#define _GNU_SOURCE
#include <stddef.h>

#include "evbench.h"

#ifdef HAVE_LIBURING
#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#define RING_ENTRIES 4096
#define CQ_ENTRIES 65536
#define REMOVE_TAG (1ULL << 62)

struct evb {
    struct io_uring ring;
    int multishot, maxfd;
    unsigned char *watched;
    int *rearm, nrearm;         /* one-shot polls that fired: re-arm next wait */
    int *stash, nstash;         /* readiness reaped inside del(): report next wait */
};

static struct io_uring_sqe *sqe_get(evb_t *b)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring);
    if (!sqe) {
        io_uring_submit(&b->ring);
        sqe = io_uring_get_sqe(&b->ring);
    }
    return sqe;
}

static int arm(evb_t *b, int fd)
{
    struct io_uring_sqe *sqe = sqe_get(b);
    if (!sqe)
        return -EBUSY;
    if (b->multishot)
        io_uring_prep_poll_multishot(sqe, fd, POLLIN);
    else
        io_uring_prep_poll_add(sqe, fd, POLLIN);
    sqe->user_data = (unsigned long long)fd;
    return 0;
}

static evb_t *create(int maxfd, int multishot)
{
    evb_t *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_CQSIZE;
    p.cq_entries = CQ_ENTRIES;
    if (io_uring_queue_init_params(RING_ENTRIES, &b->ring, &p) < 0) {
        free(b);
        return NULL;
    }
    b->multishot = multishot;
    b->maxfd = maxfd;
    b->watched = calloc(maxfd, 1);
    b->rearm = malloc(maxfd * sizeof(int));
    b->stash = malloc(maxfd * sizeof(int));
    if (!b->watched || !b->rearm || !b->stash) {
        io_uring_queue_exit(&b->ring);
        free(b->watched); free(b->rearm); free(b->stash); free(b);
        return NULL;
    }
    return b;
}

static evb_t *create_oneshot(int maxfd) { return create(maxfd, 0); }
static evb_t *create_multishot(int maxfd) { return create(maxfd, 1); }

static int ur_add(evb_t *b, int fd)
{
    if (fd >= b->maxfd || b->watched[fd])
        return -EINVAL;
    b->watched[fd] = 1;
    return arm(b, fd);
}

/* Account one completion; returns 1 when it reports readiness of a watched fd. */
static int account(evb_t *b, struct io_uring_cqe *cqe, int *fd_out)
{
    unsigned long long ud = cqe->user_data;
    if (ud & REMOVE_TAG)
        return 0;
    int fd = (int)ud;
    int more = b->multishot && (cqe->flags & IORING_CQE_F_MORE);
    if (cqe->res < 0 || !b->watched[fd])
        return 0;
    if (!more)
        b->rearm[b->nrearm++] = fd;
    *fd_out = fd;
    return 1;
}

static int ur_del(evb_t *b, int fd)
{
    if (!b->watched[fd])
        return -ENOENT;
    b->watched[fd] = 0;
    for (int i = 0; i < b->nrearm; i++)      /* a fired one-shot poll has nothing to cancel */
        if (b->rearm[i] == fd) {
            b->rearm[i] = b->rearm[--b->nrearm];
            return 0;
        }
    struct io_uring_sqe *sqe = sqe_get(b);
    if (!sqe)
        return -EBUSY;
    io_uring_prep_poll_remove(sqe, (unsigned long long)fd);
    sqe->user_data = REMOVE_TAG | (unsigned long long)fd;
    int rc = io_uring_submit(&b->ring);
    if (rc < 0)
        return rc;
    /* reap until our remove completed; keep any readiness seen meanwhile */
    for (;;) {
        struct io_uring_cqe *cqe;
        rc = io_uring_wait_cqe(&b->ring, &cqe);
        if (rc < 0)
            return rc;
        unsigned long long ud = cqe->user_data;
        int other;
        if (ud == (REMOVE_TAG | (unsigned long long)fd)) {
            io_uring_cqe_seen(&b->ring, cqe);
            return 0;
        }
        if (account(b, cqe, &other))
            b->stash[b->nstash++] = other;
        io_uring_cqe_seen(&b->ring, cqe);
    }
}

static int ur_wait(evb_t *b, int timeout_ms, int *ready, int max)
{
    int n = 0, rc;
    while (b->nstash && n < max)
        ready[n++] = b->stash[--b->nstash];
    int pending = b->nrearm;
    b->nrearm = 0;
    for (int i = 0; i < pending; i++)
        if (b->watched[b->rearm[i]] && (rc = arm(b, b->rearm[i])) < 0)
            return rc;
    struct io_uring_cqe *cqe;
    if (n > 0 || timeout_ms == 0) {
        rc = io_uring_submit(&b->ring);
    } else if (timeout_ms < 0) {
        rc = io_uring_submit_and_wait(&b->ring, 1);
    } else {
        struct __kernel_timespec ts = { timeout_ms / 1000, (timeout_ms % 1000) * 1000000LL };
        rc = io_uring_submit_and_wait_timeout(&b->ring, &cqe, 1, &ts, NULL);
        if (rc == -ETIME)
            rc = 0;
    }
    if (rc < 0)
        return rc;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&b->ring, head, cqe) {
        int fd;
        if (n >= max)
            break;
        seen++;
        if (account(b, cqe, &fd))
            ready[n++] = fd;
    }
    io_uring_cq_advance(&b->ring, seen);
    return n;
}

static void ur_destroy(evb_t *b)
{
    io_uring_queue_exit(&b->ring);
    free(b->watched); free(b->rearm); free(b->stash); free(b);
}

static const char *probe(void)
{
    static char why[160];
    struct io_uring ring;
    int rc = io_uring_queue_init(8, &ring, 0);
    if (rc < 0) {
        snprintf(why, sizeof why, "io_uring_setup failed: %s (kernel.io_uring_disabled or a seccomp policy?)",
                 strerror(-rc));
        return why;
    }
    io_uring_queue_exit(&ring);
    return NULL;
}

static const char *oneshot_unavailable(void) { return probe(); }

static const char *multishot_unavailable(void)
{
    const char *why = probe();
    if (why)
        return why;
    struct utsname u;
    int major = 0, minor = 0;
    if (uname(&u) == 0 && sscanf(u.release, "%d.%d", &major, &minor) == 2 &&
        (major > 5 || (major == 5 && minor >= 13)))
        return NULL;
    return "multishot poll needs Linux 5.13 or newer";
}

const struct backend be_uring = {
    "io_uring", oneshot_unavailable, create_oneshot, ur_add, ur_del, ur_wait, ur_destroy,
};
const struct backend be_uring_multishot = {
    "io_uring-multishot", multishot_unavailable, create_multishot, ur_add, ur_del, ur_wait, ur_destroy,
};
#else
static const char *no_liburing(void)
{
    return "built without liburing (Debian: apt-get install liburing-dev, then rebuild)";
}

const struct backend be_uring = { "io_uring", no_liburing, NULL, NULL, NULL, NULL, NULL };
const struct backend be_uring_multishot = { "io_uring-multishot", no_liburing, NULL, NULL, NULL, NULL, NULL };
#endif

/* poll(2) over a persistent pollfd array (add appends, del swap-removes
 * through an fd -> slot map), scanned linearly for revents after each call:
 * the kernel and the caller both walk all N entries every time. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdlib.h>

#include "evbench.h"

struct evb {
    struct pollfd *fds;
    int *slot;          /* fd -> index in fds, -1 when not watched */
    int n, maxfd;
};

static evb_t *poll_create(int maxfd)
{
    evb_t *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->maxfd = maxfd;
    b->fds = calloc(maxfd, sizeof *b->fds);
    b->slot = malloc(maxfd * sizeof *b->slot);
    if (!b->fds || !b->slot) {
        free(b->fds); free(b->slot); free(b);
        return NULL;
    }
    for (int i = 0; i < maxfd; i++)
        b->slot[i] = -1;
    return b;
}

static int poll_add(evb_t *b, int fd)
{
    if (fd >= b->maxfd || b->slot[fd] >= 0)
        return -EINVAL;
    b->fds[b->n] = (struct pollfd){ .fd = fd, .events = POLLIN };
    b->slot[fd] = b->n++;
    return 0;
}

static int poll_del(evb_t *b, int fd)
{
    int i = b->slot[fd];
    if (i < 0)
        return -ENOENT;
    b->fds[i] = b->fds[--b->n];
    b->slot[b->fds[i].fd] = i;
    b->slot[fd] = -1;
    return 0;
}

static int poll_wait(evb_t *b, int timeout_ms, int *ready, int max)
{
    int rc = poll(b->fds, b->n, timeout_ms), n = 0;
    if (rc < 0)
        return -errno;
    for (int i = 0; i < b->n && n < rc && n < max; i++)
        if (b->fds[i].revents)
            ready[n++] = b->fds[i].fd;
    return n;
}

static void poll_destroy(evb_t *b)
{
    free(b->fds); free(b->slot); free(b);
}

static const char *poll_unavailable(void) { return NULL; }

const struct backend be_poll = {
    "poll", poll_unavailable, poll_create, poll_add, poll_del, poll_wait, poll_destroy,
};

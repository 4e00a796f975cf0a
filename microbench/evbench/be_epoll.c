/* epoll(7), level-triggered: the kernel keeps the interest set and a
 * ready list, so a wait costs O(ready), not O(watched). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "evbench.h"

struct evb {
    int ep, cap;
    struct epoll_event *events;
};

static evb_t *ep_create(int maxfd)
{
    evb_t *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->cap = maxfd < 4096 ? maxfd : 4096;
    b->events = calloc(b->cap, sizeof *b->events);
    b->ep = epoll_create1(EPOLL_CLOEXEC);
    if (b->ep < 0 || !b->events) {
        free(b->events); free(b);
        return NULL;
    }
    return b;
}

static int ep_add(evb_t *b, int fd)
{
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
    return epoll_ctl(b->ep, EPOLL_CTL_ADD, fd, &ev) ? -errno : 0;
}

static int ep_del(evb_t *b, int fd)
{
    return epoll_ctl(b->ep, EPOLL_CTL_DEL, fd, NULL) ? -errno : 0;
}

static int ep_wait(evb_t *b, int timeout_ms, int *ready, int max)
{
    int rc = epoll_wait(b->ep, b->events, max < b->cap ? max : b->cap, timeout_ms);
    if (rc < 0)
        return -errno;
    for (int i = 0; i < rc; i++)
        ready[i] = b->events[i].data.fd;
    return rc;
}

static void ep_destroy(evb_t *b)
{
    close(b->ep); free(b->events); free(b);
}

static const char *ep_unavailable(void) { return NULL; }

const struct backend be_epoll = {
    "epoll", ep_unavailable, ep_create, ep_add, ep_del, ep_wait, ep_destroy,
};

/* kqueue(2), on the BSDs and macOS only. On other kernels this backend
 * reports itself unavailable: libkqueue's <sys/event.h> on Linux is an
 * emulation over epoll and would measure epoll under another name. */
#define _GNU_SOURCE
#include <stddef.h>

#include "evbench.h"

#if defined(__FreeBSD__) || defined(__NetBSD__) || defined(__OpenBSD__) || defined(__DragonFly__) || defined(__APPLE__)
#include <errno.h>
#include <stdlib.h>
#include <sys/event.h>
#include <sys/types.h>
#include <unistd.h>

struct evb {
    int kq, cap;
    struct kevent *events;
};

static evb_t *kq_create(int maxfd)
{
    evb_t *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->cap = maxfd < 4096 ? maxfd : 4096;
    b->events = calloc(b->cap, sizeof *b->events);
    b->kq = kqueue();
    if (b->kq < 0 || !b->events) {
        free(b->events); free(b);
        return NULL;
    }
    return b;
}

static int kq_change(evb_t *b, int fd, int flags)
{
    struct kevent ch;
    EV_SET(&ch, fd, EVFILT_READ, flags, 0, 0, NULL);
    return kevent(b->kq, &ch, 1, NULL, 0, NULL) < 0 ? -errno : 0;
}

static int kq_add(evb_t *b, int fd) { return kq_change(b, fd, EV_ADD); }
static int kq_del(evb_t *b, int fd) { return kq_change(b, fd, EV_DELETE); }

static int kq_wait(evb_t *b, int timeout_ms, int *ready, int max)
{
    struct timespec ts = { timeout_ms / 1000, (timeout_ms % 1000) * 1000000L };
    int rc = kevent(b->kq, NULL, 0, b->events, max < b->cap ? max : b->cap, timeout_ms < 0 ? NULL : &ts);
    if (rc < 0)
        return -errno;
    for (int i = 0; i < rc; i++)
        ready[i] = (int)b->events[i].ident;
    return rc;
}

static void kq_destroy(evb_t *b)
{
    close(b->kq); free(b->events); free(b);
}

static const char *kq_unavailable(void) { return NULL; }

const struct backend be_kqueue = {
    "kqueue", kq_unavailable, kq_create, kq_add, kq_del, kq_wait, kq_destroy,
};
#else
static const char *kq_unavailable(void)
{
    return "kqueue is a BSD/macOS kernel interface; this kernel has none "
           "(libkqueue's emulation over epoll is not counted)";
}

const struct backend be_kqueue = { "kqueue", kq_unavailable, NULL, NULL, NULL, NULL, NULL };
#endif

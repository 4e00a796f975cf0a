/* select(2) with bitmaps sized for any descriptor number.
 *
 * glibc's fd_set stops at FD_SETSIZE (1024); the kernel takes any nfds
 * up to the fd limit, so we keep our own arrays of longs (what Squid did
 * by raising __FD_SETSIZE). Each call copies the long-lived interest map
 * (select overwrites its input) and then scans the result a word at a
 * time, as in Mogul's fixed comm_select.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>

#include "evbench.h"

#define WORD_BITS (8 * (int)sizeof(unsigned long))

struct evb {
    int maxfd, words, top;      /* top: highest watched fd + 1 */
    unsigned long *interest, *work;
};

static evb_t *sel_create(int maxfd)
{
    evb_t *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->maxfd = maxfd;
    b->words = maxfd / WORD_BITS + 1;
    b->interest = calloc(b->words, sizeof(unsigned long));
    b->work = calloc(b->words, sizeof(unsigned long));
    if (!b->interest || !b->work) {
        free(b->interest); free(b->work); free(b);
        return NULL;
    }
    return b;
}

static int sel_add(evb_t *b, int fd)
{
    if (fd >= b->maxfd)
        return -EINVAL;
    b->interest[fd / WORD_BITS] |= 1UL << (fd % WORD_BITS);
    if (fd + 1 > b->top)
        b->top = fd + 1;
    return 0;
}

static int sel_del(evb_t *b, int fd)
{
    b->interest[fd / WORD_BITS] &= ~(1UL << (fd % WORD_BITS));
    return 0;
}

static int sel_wait(evb_t *b, int timeout_ms, int *ready, int max)
{
    int used = b->top / WORD_BITS + 1, n = 0;
    memcpy(b->work, b->interest, used * sizeof(unsigned long));
    struct timeval tv = { timeout_ms / 1000, (timeout_ms % 1000) * 1000 };
    int rc = select(b->top, (fd_set *)b->work, NULL, NULL, timeout_ms < 0 ? NULL : &tv);
    if (rc < 0)
        return -errno;
    for (int w = 0; w < used && n < max && n < rc; w++) {
        unsigned long bits = b->work[w];
        while (bits && n < max) {
            int bit = __builtin_ctzl(bits);
            ready[n++] = w * WORD_BITS + bit;
            bits &= bits - 1;
        }
    }
    return n;
}

static void sel_destroy(evb_t *b)
{
    free(b->interest); free(b->work); free(b);
}

static const char *sel_unavailable(void) { return NULL; }

const struct backend be_select = {
    "select", sel_unavailable, sel_create, sel_add, sel_del, sel_wait, sel_destroy,
};

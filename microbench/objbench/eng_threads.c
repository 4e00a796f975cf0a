/* threads: a pool of N threads doing blocking operations, as Squid's aufs
 * does (the event loop hands open/read/write/close/unlink to its threads). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

#include "objbench.h"

struct pool {
    int dirfd, nthreads, qcap, qhead, qlen, dcap, dlen, stop;
    struct op **queue, **done;
    pthread_mutex_t mu;
    pthread_cond_t work, finished;
    pthread_t *threads;
};

static void *worker(void *arg)
{
    struct pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->qlen && !p->stop)
            pthread_cond_wait(&p->work, &p->mu);
        if (p->stop)
            break;
        struct op *op = p->queue[p->qhead];
        p->qhead = (p->qhead + 1) % p->qcap;
        p->qlen--;
        pthread_mutex_unlock(&p->mu);
        op_run_blocking(p->dirfd, op);
        pthread_mutex_lock(&p->mu);
        p->done[p->dlen++] = op;
        pthread_cond_signal(&p->finished);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void *create(int dirfd, int depth, int threads)
{
    struct pool *p = calloc(1, sizeof *p);
    p->dirfd = dirfd;
    p->nthreads = threads;
    p->qcap = p->dcap = depth + 1;
    p->queue = calloc(p->qcap, sizeof *p->queue);
    p->done = calloc(p->dcap, sizeof *p->done);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->finished, NULL);
    p->threads = calloc(threads, sizeof *p->threads);
    for (int i = 0; i < threads; i++)
        pthread_create(&p->threads[i], NULL, worker, p);
    return p;
}

static int submit(void *arg, struct op *op)
{
    struct pool *p = arg;
    pthread_mutex_lock(&p->mu);
    p->queue[(p->qhead + p->qlen++) % p->qcap] = op;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

static int reap(void *arg, struct op **done, int min, int max)
{
    struct pool *p = arg;
    int n = 0;
    pthread_mutex_lock(&p->mu);
    while (p->dlen < min)
        pthread_cond_wait(&p->finished, &p->mu);
    while (p->dlen && n < max)
        done[n++] = p->done[--p->dlen];
    pthread_mutex_unlock(&p->mu);
    return n;
}

static void destroy(void *arg)
{
    struct pool *p = arg;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads); free(p->queue); free(p->done); free(p);
}

static const char *none(void) { return NULL; }
static const char *all_ops(enum op_kind k) { (void)k; return NULL; }

const struct engine eng_threads = { "threads", none, all_ops, create, submit, reap, destroy };

/* evbench: what one wait costs, per readiness mechanism, and why.
 *
 * Modes (one measurement point per run; the Python runner sweeps):
 *   idle      N watched descriptors, K of them ready; cost per call (hot:
 *             the same K stay ready; cold: the ready K rotate over all N)
 *   churn     register + deregister one descriptor per simulated request,
 *             with N others watched; alone and with one empty wait between
 *   load      a producer thread makes descriptors ready at a fixed rate, the
 *             event loop handles each with a fixed amount of work: events
 *             per call as load rises (Mogul's batching)
 *   libevent  libevent's test/bench.c workload (-n pipes, -a active, -w writes)
 *   list      which backends this build and kernel have, and why not
 * Every run also measures, in the same process, the cost of a null system
 * call and of reading the clock, so results carry their own floor.
 * Output: one JSON document on stdout.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "evbench.h"

static const struct backend *BACKENDS[] = {
    &be_select, &be_poll, &be_epoll, &be_uring, &be_uring_multishot, &be_kqueue,
};
#define NBACKENDS (int)(sizeof BACKENDS / sizeof BACKENDS[0])
#define FD_RESERVE 64           /* descriptors kept for stdio, the backend's own, spares */

struct opts {
    const char *backend, *mode, *ready;
    int n, k, calls, reps, warmup, tcp, pin, rate, duration_ms, work_us, lib_a, lib_w;
};

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static double cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* The document is built in memory and written to stdout only when complete:
 * an error half-way prints one error document, never a truncated result. */
static FILE *out;
static char *out_buf;
static size_t out_len;

static void die(const char *what, int err)
{
    printf("{\"harness\": \"evbench\", \"error\": \"%s: %s\"}\n", what, strerror(err));
    exit(1);
}

static void out_begin(void)
{
    out = open_memstream(&out_buf, &out_len);
    if (!out)
        die("open_memstream", errno);
}

static int out_end(void)
{
    if (fclose(out) != 0)
        die("write result", errno);
    fwrite(out_buf, 1, out_len, stdout);
    free(out_buf);
    return fflush(stdout) == 0 ? 0 : 1;
}

/* ---- descriptors ---------------------------------------------------- */

static rlim_t raise_nofile(rlim_t *soft_before)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    *soft_before = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
    return rl.rlim_cur;
}

static void nonblock(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* pairs[i][0] is watched, pairs[i][1] is written to make it ready */
static int (*make_pairs(int n, int tcp))[2]
{
    int (*p)[2] = calloc(n, sizeof *p);
    if (!p)
        die("calloc", ENOMEM);
    if (!tcp) {
        for (int i = 0; i < n; i++)
            if (socketpair(AF_UNIX, SOCK_STREAM, 0, p[i]) < 0)
                die("socketpair", errno);
    } else {
        int ls = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len = sizeof a;
        if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 4096) < 0 ||
            getsockname(ls, (struct sockaddr *)&a, &len) < 0)
            die("listen on 127.0.0.1", errno);
        for (int i = 0; i < n; i++) {
            int c = socket(AF_INET, SOCK_STREAM, 0);
            if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) < 0)
                die("connect 127.0.0.1", errno);
            int s = accept(ls, NULL, NULL);
            if (s < 0)
                die("accept", errno);
            p[i][0] = s;
            p[i][1] = c;
        }
        close(ls);
    }
    for (int i = 0; i < n; i++) {
        nonblock(p[i][0]);
        nonblock(p[i][1]);
    }
    return p;
}

static void poke(int fd)
{
    if (write(fd, "e", 1) != 1)
        die("write", errno);
}

static int drain(int fd)
{
    char buf[64];
    ssize_t got = read(fd, buf, sizeof buf);
    return got > 0 ? (int)got : 0;
}

/* ---- floors measured in the same run -------------------------------- */

static double null_syscall_ns(void)
{
    int iters = 200000;
    double t0 = now_ns();
    for (int i = 0; i < iters; i++)
        syscall(SYS_getppid);
    return (now_ns() - t0) / iters;
}

static double timer_ns(void)
{
    int iters = 200000;
    double t0 = now_ns(), sink = 0;
    for (int i = 0; i < iters; i++)
        sink += now_ns();
    return (now_ns() - t0) / iters + (sink < 0);
}

/* ---- JSON ------------------------------------------------------------ */

static void json_head(const struct opts *o, const struct backend *be, int n_used, rlim_t soft, rlim_t hard,
                      int capped)
{
    fprintf(out, "{\"harness\": \"evbench\", \"version\": 1, \"backend\": \"%s\", \"mode\": \"%s\", ",
           be->name, o->mode);
    fprintf(out, "\"params\": {\"n\": %d, \"n_requested\": %d, \"k\": %d, \"ready\": \"%s\", \"calls\": %d, "
           "\"reps\": %d, \"warmup\": %d, \"transport\": \"%s\", \"pin\": %d, \"rate\": %d, "
           "\"duration_ms\": %d, \"work_us\": %d, \"libevent_a\": %d, \"libevent_w\": %d}, ",
           n_used, o->n, o->k, o->ready, o->calls, o->reps, o->warmup, o->tcp ? "tcp" : "socketpair", o->pin,
           o->rate, o->duration_ms, o->work_us, o->lib_a, o->lib_w);
    fprintf(out, "\"nofile\": {\"soft_before\": %llu, \"raised_to\": %llu, \"capped\": %s}, ",
           (unsigned long long)soft, (unsigned long long)hard, capped ? "true" : "false");
    fprintf(out, "\"floor\": {\"null_syscall_ns\": %.1f, \"timer_ns\": %.1f}, ", null_syscall_ns(), timer_ns());
}

static void unavailable(const struct opts *o, const char *name, const char *why)
{
    fprintf(out, "{\"harness\": \"evbench\", \"version\": 1, \"backend\": \"%s\", \"mode\": \"%s\", "
           "\"available\": false, \"reason\": \"%s\"}\n", name, o->mode, why);
}

/* ---- modes ------------------------------------------------------------ */

static void mode_idle(const struct opts *o, const struct backend *be, evb_t *b, int (*p)[2], int n)
{
    int k = o->k, cold = strcmp(o->ready, "cold") == 0, *ready = malloc((k + 1) * sizeof(int));
    int stride = n / k, off = 0, bad = 0, got;
    double tnow = timer_ns();
    /* Hot: the K stay ready from here on. Cold: nothing ready before the first
     * call, which makes its own K ready. (Poking before it would leave io_uring
     * completions for descriptors the first call has already drained: a
     * completion reports an event that happened, not a state that still holds.) */
    if (!cold)
        for (int i = 0; i < k; i++)
            poke(p[i * stride][1]);
    fprintf(out, "\"available\": true, \"reps\": [");
    for (int r = -1; r < o->reps; r++) {             /* r = -1: warm-up, not reported */
        int calls = r < 0 ? o->warmup : o->calls;
        double waited = 0, c0 = cpu_ns(), t0 = now_ns(), events = 0;
        for (int c = 0; c < calls; c++) {
            if (cold) {                               /* rotate readiness, outside the timed call */
                for (int i = 0; i < k; i++)
                    drain(p[(off + i * stride) % n][0]);
                off = (off + 1) % n;
                for (int i = 0; i < k; i++)
                    poke(p[(off + i * stride) % n][1]);
                double s = now_ns();
                got = be->wait(b, -1, ready, k + 1);
                waited += now_ns() - s - tnow;
            } else {
                got = be->wait(b, -1, ready, k + 1);
            }
            if (got < 0)
                die("wait", -got);
            bad += got != k;
            events += got;
        }
        double wall = now_ns() - t0, cpu = cpu_ns() - c0;
        if (r < 0)
            continue;
        double per_call = cold ? waited / calls : wall / calls;
        fprintf(out, "%s{\"ns_per_call\": %.1f, \"events_per_call\": %.3f, \"ns_per_event\": %.2f, "
               "\"cpu_share\": %.3f}", r ? ", " : "", per_call, events / calls, per_call * calls / (events ? events : 1),
               cpu / wall);
    }
    fprintf(out, "], \"wrong_counts\": %d}\n", bad);
    free(ready);
}

static void mode_churn(const struct opts *o, const struct backend *be, evb_t *b, int (*p)[2], int n)
{
    int spare = p[n][0], ready[4];
    fprintf(out, "\"available\": true, \"reps\": [");
    for (int r = -1; r < o->reps; r++) {
        int calls = r < 0 ? o->warmup : o->calls;
        double c0 = cpu_ns(), t0 = now_ns();
        for (int c = 0; c < calls; c++)
            if (be->add(b, spare) || be->del(b, spare))
                die("add/del", EINVAL);
        double ctl = now_ns() - t0, t1 = now_ns();
        for (int c = 0; c < calls; c++) {
            if (be->add(b, spare))
                die("add", EINVAL);
            if (be->wait(b, 0, ready, 4) < 0)
                die("wait", EINVAL);
            if (be->del(b, spare))
                die("del", EINVAL);
        }
        double with_wait = now_ns() - t1, cpu = cpu_ns() - c0;
        if (r < 0)
            continue;
        fprintf(out, "%s{\"ns_per_request\": %.1f, \"ns_per_request_with_wait\": %.1f, \"cpu_share\": %.3f}",
               r ? ", " : "", ctl / calls, with_wait / calls, cpu / (ctl + with_wait));
    }
    fprintf(out, "]}\n");
}

struct producer {
    int (*p)[2];
    int n, rate;
    double start, end;
    long writes;
    volatile int done;
};

static void *produce(void *arg)
{
    struct producer *pr = arg;
    unsigned seed = 12345;
    double gap = 1e9 / pr->rate;
    for (long i = 0;; i++) {
        double due = pr->start + i * gap;
        if (due > pr->end)
            break;
        while (now_ns() < due)
            ;
        poke(pr->p[rand_r(&seed) % pr->n][1]);
        pr->writes++;
    }
    pr->done = 1;
    return NULL;
}

static void spin_ns(double ns)
{
    double until = now_ns() + ns;
    while (now_ns() < until)
        ;
}

static void mode_load(const struct opts *o, const struct backend *be, evb_t *b, int (*p)[2], int n)
{
    int max = n < 4096 ? n : 4096, *ready = malloc(max * sizeof(int));
    fprintf(out, "\"available\": true, \"reps\": [");
    for (int r = 0; r < o->reps; r++) {
        struct producer pr = { p, n, o->rate, 0, 0, 0, 0 };
        pr.start = now_ns() + 1e6;
        pr.end = pr.start + o->duration_ms * 1e6;
        pthread_t th;
        pthread_create(&th, NULL, produce, &pr);
        long calls = 0, events = 0, bytes = 0;
        double in_wait = 0, t0 = now_ns();
        while (!pr.done || bytes < pr.writes) {
            double s = now_ns();
            int got = be->wait(b, 10, ready, max);
            in_wait += now_ns() - s;
            if (got < 0)
                die("wait", -got);
            calls++;
            events += got;
            for (int i = 0; i < got; i++) {
                int fd = ready[i];
                bytes += drain(fd);
                spin_ns(o->work_us * 1e3);          /* the request's own work */
            }
        }
        double wall = now_ns() - t0;
        pthread_join(th, NULL);
        fprintf(out, "%s{\"offered_per_s\": %d, \"writes\": %ld, \"events\": %ld, \"calls\": %ld, "
               "\"events_per_call\": %.3f, \"handled_per_s\": %.1f, \"wait_ns_per_event\": %.1f, "
               "\"wall_ms\": %.1f}", r ? ", " : "", o->rate, pr.writes, events, calls,
               calls ? (double)events / calls : 0, events / (wall / 1e9), events ? in_wait / events : 0,
               wall / 1e6);
    }
    fprintf(out, "]}\n");
    free(ready);
}

/* libevent test/bench.c: each read writes to the next pipe until W writes are done */
static void mode_libevent(const struct opts *o, const struct backend *be, evb_t *b, int (*p)[2], int n)
{
    int top = 0;
    for (int i = 0; i < n; i++)
        top = p[i][0] > top ? p[i][0] : top;
    int *ready = malloc(n * sizeof(int)), *index = calloc(top + 1, sizeof(int));
    if (!ready || !index)
        die("calloc", ENOMEM);
    for (int i = 0; i < n; i++)
        index[p[i][0]] = i;
    fprintf(out, "\"available\": true, \"reps\": [");
    for (int r = -1; r < o->reps; r++) {
        int space = n / o->lib_a * 2, fired = 0, count = 0, writes = o->lib_w;
        if (space < 1)
            space = 1;
        for (int i = 0; i < o->lib_a; i++, fired++)
            poke(p[(i * space) % n][1]);
        double t0 = now_ns();
        while (count != fired) {
            int got = be->wait(b, 0, ready, n);
            if (got < 0)
                die("wait", -got);
            for (int i = 0; i < got; i++) {
                int idx = index[ready[i]], widx = (idx + 1) % n;
                count += drain(ready[i]);
                if (writes) {
                    poke(p[widx][1]);
                    writes--;
                    fired++;
                }
            }
        }
        double us = (now_ns() - t0) / 1e3;
        if (r >= 0)
            fprintf(out, "%s{\"us_per_run\": %.1f, \"fired\": %d}", r ? ", " : "", us, fired);
    }
    fprintf(out, "]}\n");
    free(ready); free(index);
}

/* ---- main ------------------------------------------------------------- */

static void list_backends(void)
{
    fprintf(out, "{\"harness\": \"evbench\", \"version\": 1, \"mode\": \"list\", \"backends\": [");
    for (int i = 0; i < NBACKENDS; i++) {
        const char *why = BACKENDS[i]->unavailable();
        fprintf(out, "%s{\"name\": \"%s\", \"available\": %s, \"reason\": \"%s\"}", i ? ", " : "", BACKENDS[i]->name,
               why ? "false" : "true", why ? why : "");
    }
    fprintf(out, "]}\n");
}

static void usage(void)
{
    fprintf(stderr, "usage: evbench --mode idle|churn|load|libevent|list --backend NAME [--n N] [--k K]\n"
                    "       [--ready hot|cold] [--calls C] [--reps R] [--warmup W] [--tcp] [--pin CPU]\n"
                    "       [--rate EVENTS_PER_S] [--duration-ms MS] [--work-us US] [-n N -a A -w W]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    struct opts o = { "epoll", "idle", "hot", 1000, 1, 1000, 5, 100, 0, -1, 10000, 1000, 20, 1, 100 };
    static struct option longs[] = {
        {"backend", 1, 0, 'b'}, {"mode", 1, 0, 'm'}, {"ready", 1, 0, 'r'}, {"n", 1, 0, 'N'}, {"k", 1, 0, 'k'},
        {"calls", 1, 0, 'c'}, {"reps", 1, 0, 'R'}, {"warmup", 1, 0, 'W'}, {"tcp", 0, 0, 't'}, {"pin", 1, 0, 'p'},
        {"rate", 1, 0, 'L'}, {"duration-ms", 1, 0, 'D'}, {"work-us", 1, 0, 'U'}, {0, 0, 0, 0},
    };
    int c;
    out_begin();
    while ((c = getopt_long(argc, argv, "n:a:w:", longs, NULL)) != -1) {
        switch (c) {
        case 'b': o.backend = optarg; break;
        case 'm': o.mode = optarg; break;
        case 'r': o.ready = optarg; break;
        case 'N': case 'n': o.n = atoi(optarg); break;
        case 'k': o.k = atoi(optarg); break;
        case 'c': o.calls = atoi(optarg); break;
        case 'R': o.reps = atoi(optarg); break;
        case 'W': o.warmup = atoi(optarg); break;
        case 't': o.tcp = 1; break;
        case 'p': o.pin = atoi(optarg); break;
        case 'L': o.rate = atoi(optarg); break;
        case 'D': o.duration_ms = atoi(optarg); break;
        case 'U': o.work_us = atoi(optarg); break;
        case 'a': o.lib_a = atoi(optarg); break;
        case 'w': o.lib_w = atoi(optarg); break;
        default: usage();
        }
    }
    if (strcmp(o.mode, "list") == 0) {
        list_backends();
        return out_end();
    }
    const struct backend *be = NULL;
    for (int i = 0; i < NBACKENDS; i++)
        if (strcmp(BACKENDS[i]->name, o.backend) == 0)
            be = BACKENDS[i];
    if (!be || o.n < 1 || o.k < 1 || o.k > o.n || o.reps < 1 || o.calls < 1 || o.rate < 1 || o.lib_a < 1)
        usage();
    const char *why = be->unavailable();
    if (why) {
        unavailable(&o, be->name, why);
        return out_end();
    }
    if (be == &be_uring_multishot && strcmp(o.mode, "idle") == 0 && strcmp(o.ready, "hot") == 0) {
        unavailable(&o, be->name, "multishot poll is edge-triggered: it reports new readiness only, "
                                  "so it has no hot mode (the same descriptors staying ready)");
        return out_end();
    }
    if (o.pin >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(o.pin, &set);
        if (sched_setaffinity(0, sizeof set, &set) < 0)
            die("sched_setaffinity", errno);
    }
    rlim_t soft, hard = raise_nofile(&soft);
    int n = o.n, capped = 0, max_n = (int)((hard - FD_RESERVE) / 2);
    if (n > max_n) {
        n = max_n;
        capped = 1;
        if (o.k > n)
            o.k = n;
    }
    int (*p)[2] = make_pairs(n + 1, o.tcp);     /* one spare pair for churn */
    evb_t *b = be->create((int)hard);
    if (!b)
        die("backend create", errno ? errno : ENOMEM);
    for (int i = 0; i < n; i++)
        if (be->add(b, p[i][0]))
            die("backend add", EINVAL);
    json_head(&o, be, n, soft, hard, capped);
    if (strcmp(o.mode, "idle") == 0)
        mode_idle(&o, be, b, p, n);
    else if (strcmp(o.mode, "churn") == 0)
        mode_churn(&o, be, b, p, n);
    else if (strcmp(o.mode, "load") == 0)
        mode_load(&o, be, b, p, n);
    else if (strcmp(o.mode, "libevent") == 0)
        mode_libevent(&o, be, b, p, n);
    else
        usage();
    be->destroy(b);
    return out_end();
}

/* fdscan: Mogul's comm_select() study ("Speedier Squid", 1999) on today's CPUs.
 *
 * Each call does what comm_select did around one select(): build the read
 * and write interest bitmaps from the fd table (Figure 2), take select's
 * answer, then find the ready descriptors and call their handlers
 * (Figure 3). The kernel's select is replaced by a fixed answer (the
 * interest sets ANDed with K ready descriptors) so that only the user-space
 * work Mogul profiled is measured. Variants, in his order:
 *   1  array of Squid-like entries, the three fields on three cache lines
 *   2  the same entries with the three fields adjacent (one cache line)
 *   3  a separate compact array holding just the three fields
 *   4  long-lived interest bitmaps, updated when a handler changes; copied per call
 *   5  as 4, plus a word-at-a-time scan of the result bitmaps
 * Output: one JSON document. Cache misses come from outside (perf or
 * cachegrind), by running two call counts and taking the difference.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void handler_fn(int fd, void *data);

#define ENTRY_SIZE 256
struct fde_far {                    /* variant 1: fields at offsets 0, 96, 192 */
    handler_fn *read_handler;
    char pad1[88];
    long stall_until;
    char pad2[88];
    handler_fn *write_handler;
    char pad3[ENTRY_SIZE - 200];
};
struct fde_near {                   /* variant 2: same size, fields adjacent */
    handler_fn *read_handler;
    long stall_until;
    handler_fn *write_handler;
    char pad[ENTRY_SIZE - 24];
};
struct fde_compact {                /* variant 3: only what the loop reads */
    handler_fn *read_handler;
    long stall_until;
    handler_fn *write_handler;
};
_Static_assert(sizeof(struct fde_far) == ENTRY_SIZE, "far entry size");
_Static_assert(sizeof(struct fde_near) == ENTRY_SIZE, "near entry size");

#define WORD_BITS (8 * (int)sizeof(unsigned long))
#define ISSET(map, fd) ((map)[(fd) / WORD_BITS] >> ((fd) % WORD_BITS) & 1UL)
#define SET(map, fd) ((map)[(fd) / WORD_BITS] |= 1UL << ((fd) % WORD_BITS))

static volatile long handled;
static void on_read(int fd, void *data) { (void)fd; (void)data; handled++; }
static void on_write(int fd, void *data) { (void)fd; (void)data; handled++; }

struct state {
    int n, words, variant;
    long now;
    struct fde_far *far;
    struct fde_near *near;
    struct fde_compact *compact;
    unsigned long *rd_interest, *wr_interest;   /* long-lived (variants 4, 5) */
    unsigned long *rd, *wr, *ready;              /* per call */
};

static handler_fn *read_of(struct state *s, int fd)
{
    switch (s->variant) {
    case 1: return s->far[fd].read_handler;
    case 2: return s->near[fd].read_handler;
    default: return s->compact[fd].read_handler;
    }
}

static handler_fn *write_of(struct state *s, int fd)
{
    switch (s->variant) {
    case 1: return s->far[fd].write_handler;
    case 2: return s->near[fd].write_handler;
    default: return s->compact[fd].write_handler;
    }
}

/* Figure 2: the interest sets, from the table or from long-lived bitmaps */
static void build(struct state *s)
{
    size_t bytes = s->words * sizeof(unsigned long);
    if (s->variant >= 4) {
        memcpy(s->rd, s->rd_interest, bytes);
        memcpy(s->wr, s->wr_interest, bytes);
        return;
    }
    memset(s->rd, 0, bytes);
    memset(s->wr, 0, bytes);
    for (int i = 0; i < s->n; i++) {
        switch (s->variant) {
        case 1:
            if (s->far[i].read_handler && s->far[i].stall_until <= s->now)
                SET(s->rd, i);
            if (s->far[i].write_handler)
                SET(s->wr, i);
            break;
        case 2:
            if (s->near[i].read_handler && s->near[i].stall_until <= s->now)
                SET(s->rd, i);
            if (s->near[i].write_handler)
                SET(s->wr, i);
            break;
        default:
            if (s->compact[i].read_handler && s->compact[i].stall_until <= s->now)
                SET(s->rd, i);
            if (s->compact[i].write_handler)
                SET(s->wr, i);
        }
    }
}

/* select()'s answer: the interest sets narrowed to the ready descriptors */
static void fake_select(struct state *s)
{
    for (int w = 0; w < s->words; w++) {
        s->rd[w] &= s->ready[w];
        s->wr[w] &= s->ready[w];
    }
}

static void dispatch(struct state *s, int fd)
{
    handler_fn *h;
    if (ISSET(s->rd, fd) && (h = read_of(s, fd)))
        h(fd, NULL);
    if (ISSET(s->wr, fd) && (h = write_of(s, fd)))
        h(fd, NULL);
}

/* Figure 3: bit by bit (variants 1-4) or a word at a time (variant 5) */
static void scan(struct state *s)
{
    if (s->variant < 5) {
        for (int fd = 0; fd < s->n; fd++) {
            if (!ISSET(s->rd, fd) && !ISSET(s->wr, fd))
                continue;
            dispatch(s, fd);
        }
        return;
    }
    for (int w = 0; w < s->words; w++) {
        unsigned long bits = s->rd[w] | s->wr[w];
        while (bits) {
            dispatch(s, w * WORD_BITS + __builtin_ctzl(bits));
            bits &= bits - 1;
        }
    }
}

static void setup(struct state *s, int write_every, int k)
{
    int n = s->n;
    s->words = n / WORD_BITS + 1;
    s->far = s->variant == 1 ? calloc(n, sizeof *s->far) : NULL;
    s->near = s->variant == 2 ? calloc(n, sizeof *s->near) : NULL;
    s->compact = s->variant >= 3 ? calloc(n, sizeof *s->compact) : NULL;
    s->rd_interest = calloc(s->words, sizeof(unsigned long));
    s->wr_interest = calloc(s->words, sizeof(unsigned long));
    s->rd = calloc(s->words, sizeof(unsigned long));
    s->wr = calloc(s->words, sizeof(unsigned long));
    s->ready = calloc(s->words, sizeof(unsigned long));
    s->now = 1000;
    for (int i = 0; i < n; i++) {          /* every connection reads; every k-th also writes */
        handler_fn *w = i % write_every == 0 ? on_write : NULL;
        if (s->far) { s->far[i].read_handler = on_read; s->far[i].write_handler = w; }
        if (s->near) { s->near[i].read_handler = on_read; s->near[i].write_handler = w; }
        if (s->compact) { s->compact[i].read_handler = on_read; s->compact[i].write_handler = w; }
        SET(s->rd_interest, i);            /* what variants 4-5 keep up to date on handler changes */
        if (w)
            SET(s->wr_interest, i);
    }
    for (int i = 0; i < k; i++)
        SET(s->ready, (int)((long)i * n / k));
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    struct state s = { .n = 10000, .variant = 1 };
    int calls = 1000, reps = 5, k = 8, write_every = 8, c;
    static struct option longs[] = {
        {"variant", 1, 0, 'v'}, {"n", 1, 0, 'n'}, {"calls", 1, 0, 'c'}, {"reps", 1, 0, 'r'},
        {"ready", 1, 0, 'k'}, {0, 0, 0, 0},
    };
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'v': s.variant = atoi(optarg); break;
        case 'n': s.n = atoi(optarg); break;
        case 'c': calls = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'k': k = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: fdscan --variant 1-5 --n N --calls C --reps R --ready K\n");
            return 2;
        }
    }
    if (s.variant < 1 || s.variant > 5 || s.n < 1 || calls < 0 || reps < 1 || k < 1 || k > s.n) {
        fprintf(stderr, "fdscan: bad arguments\n");
        return 2;
    }
    setup(&s, write_every, k);
    printf("{\"harness\": \"fdscan\", \"version\": 1, \"variant\": %d, \"n\": %d, \"calls\": %d, "
           "\"ready\": %d, \"entry_bytes\": %d, \"reps\": [", s.variant, s.n, calls, k,
           s.variant <= 2 ? ENTRY_SIZE : s.variant == 3 ? (int)sizeof(struct fde_compact) : 0);
    for (int r = 0; r < reps; r++) {
        long before = handled;
        double t0 = now_ns();
        for (int i = 0; i < calls; i++) {
            build(&s);
            fake_select(&s);
            scan(&s);
        }
        double ns = now_ns() - t0;
        printf("%s{\"ns_per_call\": %.1f, \"handlers_per_call\": %.2f}", r ? ", " : "",
               calls ? ns / calls : 0.0, calls ? (double)(handled - before) / calls : 0.0);
    }
    printf("]}\n");
    return 0;
}

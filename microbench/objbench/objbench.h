/* objbench: a web cache's object store under a PolyMix-like load.
 *
 * Stores turn cache hits, misses and evictions into I/O operations; engines
 * execute operations (synchronously, on a thread pool, with POSIX AIO, or
 * with io_uring); the driver in main.c keeps `depth` operations in flight
 * and measures each one from submission to completion.
 */
#ifndef OBJBENCH_H
#define OBJBENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MAX_OBJECT (1 << 20)        /* objects above 1 MiB are clipped (0.02% of the mix) */
#define ALIGN 4096

enum op_kind { OP_FILE_WRITE, OP_FILE_READ, OP_UNLINK, OP_PWRITE, OP_PREAD };

struct op {
    enum op_kind kind;
    char path[32];                  /* file ops: relative to the store directory */
    int fd;                         /* pwrite/pread: the store's file or device */
    char *buf;
    size_t len;
    off_t off;
    uint64_t id;                    /* object id (0 for stripe writes) */
    size_t obj_len;                 /* object bytes inside buf (reads may be aligned up) */
    size_t obj_skip;                /* where the object starts inside buf */
    int stripe;                     /* log store: stripe of this operation, -1 if none */
    double t_submit;
    ssize_t result;                 /* bytes moved, or -errno */
    int state, tmpfd;               /* engine-private (io_uring's open/io/close steps) */
    int slot;                       /* driver's buffer slot */
};

struct engine {
    const char *name;
    const char *(*unavailable)(void);
    const char *(*unsupported)(enum op_kind kind);  /* why this engine cannot do it, or NULL */
    void *(*create)(int dirfd, int depth, int threads);
    int (*submit)(void *e, struct op *op);
    int (*reap)(void *e, struct op **done, int min, int max);   /* >= min completions */
    void (*destroy)(void *e);
};

extern const struct engine eng_sync, eng_threads, eng_aio, eng_uring;

/* the blocking implementation of every operation (sync and thread-pool engines) */
void op_run_blocking(int dirfd, struct op *op);

/* workload.c */
uint64_t rng_next(uint64_t *s);
double rng_unit(uint64_t *s);
size_t object_size(uint64_t id, uint64_t seed);
void fill_content(char *buf, uint64_t id, size_t len);
int check_content(const char *buf, uint64_t id, size_t len);
struct zipf;
struct zipf *zipf_new(size_t n, double alpha);
size_t zipf_draw(struct zipf *z, uint64_t *s);

#endif

/* ---- index.c: the cache's in-memory index, oldest first (FIFO eviction) ---- */
struct entry {
    uint64_t id, loc;           /* loc: file number (ufs) or byte offset (log) */
    uint32_t size;
    uint8_t live, pending;      /* pending: its write is still in flight */
    uint16_t readers;           /* reads in flight: not evicted until they land (Squid's entry lock) */
};

struct index {
    struct entry *ring;
    size_t cap, head, count;    /* count includes dead entries not yet popped */
    int64_t *table;             /* id hash -> ring position, -1 empty, -2 deleted */
    size_t tsize, used;
    uint64_t bytes, objects;    /* live totals */
};

void index_init(struct index *ix, size_t cap);
int64_t index_find(struct index *ix, uint64_t id);
int64_t index_add(struct index *ix, uint64_t id, uint64_t loc, uint32_t size);
void index_kill(struct index *ix, int64_t pos);
struct entry *index_oldest(struct index *ix, int64_t *pos);   /* oldest live entry, NULL if none */
void index_pop(struct index *ix);                              /* drop the head slot */
int index_save(struct index *ix, const char *path, const void *extra, size_t extra_len);
int index_load(struct index *ix, const char *path, void *extra, size_t extra_len);

/* ---- the driver and the stores ---- */
struct bench;
struct store {
    const char *name;
    int (*open)(struct bench *b, int fresh);
    int (*miss)(struct bench *b, uint64_t id, size_t size);
    int (*hit)(struct bench *b, int64_t pos);
    void (*completed)(struct bench *b, struct op *op);
    int (*sync)(struct bench *b);
    int (*save)(struct bench *b);
};

extern const struct store store_ufs, store_largefile, store_rawdev;

struct bench {
    const struct store *store;
    const struct engine *engine;
    void *eng;
    const char *path;           /* directory (ufs), file (largefile) or device (rawdev) */
    int dirfd, fd, depth, verify;
    uint64_t capacity, seed;
    struct index ix;
    /* buffers for object operations */
    char **bufs;
    int *free_bufs, nfree;
    int inflight;
    /* log store state */
    uint64_t log_start, log_end;        /* the log's byte range */
    int stripe_slot;                    /* buffer slot of the stripe being filled, -1 none */
    size_t stripe_fill;
    uint64_t stripe_off;
    int *stripe_reads;                  /* in-flight reads per stripe */
    struct { uint64_t next_fn, next_id, head; } persist;   /* kept between phases */
    const char *state;                  /* log stores: where the index is saved */
    struct op *ops;                     /* in-flight operations, one per buffer slot */
    int *stripe_writes;                 /* in-flight writes per stripe */
    uint64_t nstripes;
    /* measurements */
    uint64_t io_ops, bytes_moved, hits, misses, mem_hits, evictions, errors, bad_reads;
    double *lat;
    size_t nlat, latcap;
};

int bench_submit(struct bench *b, struct op *op);      /* takes a buffer slot already set in op */
int bench_take_buffer(struct bench *b);                 /* reaps until a buffer is free */
int bench_drain(struct bench *b, int until_inflight);
void bench_fail(const char *what, int err);

#define STRIPE (1 << 20)
#define HIGH_WATER 0.95
#define LOW_WATER 0.90

/* evbench: one interface over every readiness mechanism.
 *
 * A backend watches descriptors for readability. add/del change the
 * interest set (what a proxy does per connection); wait blocks up to
 * timeout_ms and fills `ready` with at most `max` ready descriptors.
 * A backend the platform lacks says why in unavailable(); it is never
 * emulated through another mechanism.
 */
#ifndef EVBENCH_H
#define EVBENCH_H

typedef struct evb evb_t;

struct backend {
    const char *name;
    const char *(*unavailable)(void);          /* NULL when usable, else the reason */
    evb_t *(*create)(int maxfd);
    int (*add)(evb_t *b, int fd);               /* 0 or -errno */
    int (*del)(evb_t *b, int fd);
    int (*wait)(evb_t *b, int timeout_ms, int *ready, int max);   /* count, or -errno */
    void (*destroy)(evb_t *b);
};

extern const struct backend be_select, be_poll, be_epoll, be_uring, be_uring_multishot, be_kqueue;

#endif

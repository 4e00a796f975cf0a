/* loopserver: a small event-loop server with a built-in load generator, for
 * the doctor's tests. Two classic mistakes, one per mode:
 *
 *   --mode poll   poll() over every connection, a few busy among --idle idle
 *                 ones, then scan_ready() walks the whole table per call
 *                 (Squid's comm_select before Mogul): poll-scan, cpu-hotspot.
 *   --mode fsync  epoll, but every request appends to a log and fsync()s it
 *                 on the loop thread: blocking-disk-io.
 *
 * Each connection is a socketpair; the parent serves one end, a forked
 * child holds the other ends and drives the busy ones (ping-pong, 64
 * bytes). Both exit after --seconds. Prints "ready <server pid>".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSG 64

struct conn {                    /* Squid's fde, as Mogul found it: 256 bytes, the fields the */
    int fd;                      /* scan reads on separate cache lines */
    char pad0[60];
    void (*read_handler)(int);
    char pad1[56];
    void (*write_handler)(int);
    char pad2[56];
    long last_active, timeout;
    char pad3[48];
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what) { perror(what); exit(2); }
static void handler(int fd) { (void)fd; }

static void serve_one(int fd, int logfd) {
    char buf[MSG];
    ssize_t r = read(fd, buf, sizeof buf);
    if (r <= 0) return;
    if (logfd >= 0) {                                    /* the blocking mistake */
        if (write(logfd, buf, (size_t)r) < 0 || fsync(logfd) < 0) die("log");
    }
    if (write(fd, buf, (size_t)r) < 0 && errno != EAGAIN) die("write");
}

static void client(int *fds, int idle, int busy, double until) {
    prctl(PR_SET_NAME, "loadclient");    /* not one of the server's workers */
    char buf[MSG];
    memset(buf, 'x', sizeof buf);
    struct pollfd *p = calloc(busy, sizeof *p);
    for (int i = 0; i < busy; i++) {
        p[i].fd = fds[idle + i];
        p[i].events = POLLIN;
        if (write(p[i].fd, buf, MSG) < 0) die("client write");
    }
    while (now() < until) {
        if (poll(p, busy, 200) < 0 && errno != EINTR) die("client poll");
        for (int i = 0; i < busy; i++)
            if (p[i].revents & POLLIN) {
                if (read(p[i].fd, buf, MSG) <= 0) exit(0);
                if (write(p[i].fd, buf, MSG) < 0) exit(0);
            }
    }
    exit(0);
}

/* The O(N) loop, Squid's comm_select() before Mogul: every call rebuilds the
 * poll set from the fd table, polls, then walks the whole table again for
 * the ready descriptors and the timeouts. Returns the number served. */
__attribute__((noinline)) static int comm_select(struct pollfd *pfd, struct conn *c, int n, long tick) {
    for (int i = 0; i < n; i++) {
        pfd[i].fd = c[i].fd;
        pfd[i].events = (short)((c[i].read_handler ? POLLIN : 0) | (c[i].write_handler ? POLLOUT : 0));
    }
    int ready = poll(pfd, n, 200);
    if (ready < 0) { if (errno == EINTR) return 0; die("poll"); }
    int served = 0;
    for (int i = 0; i < n; i++) {
        if (c[i].last_active + c[i].timeout < tick)
            c[i].timeout += 1;
        if (pfd[i].revents) { c[i].last_active = tick; serve_one(c[i].fd, -1); served++; }
    }
    return served;
}

int main(int argc, char **argv) {
    const char *mode = "poll", *logpath = "loopserver.log";
    int idle = 3000, busy = 4;
    double seconds = 30;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mode")) mode = argv[i + 1];
        else if (!strcmp(argv[i], "--idle")) idle = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--busy")) busy = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--log")) logpath = argv[i + 1];
        else { fprintf(stderr, "usage: loopserver [--mode poll|fsync] [--idle N] [--busy K] [--seconds S] [--log FILE]\n"); return 2; }
    }
    int use_fsync = !strcmp(mode, "fsync");
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    int total = idle + busy;

    /* one socketpair per connection: the server keeps one end, the client child the other */
    int *mine = calloc(total, sizeof(int)), *theirs = calloc(total, sizeof(int));
    for (int i = 0; i < total; i++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) die("socketpair");
        mine[i] = sv[0];
        theirs[i] = sv[1];
    }
    double until = now() + seconds;
    pid_t kid = fork();
    if (kid < 0) die("fork");
    if (kid == 0) {
        for (int i = 0; i < total; i++) close(mine[i]);
        client(theirs, idle, busy, until);
    }
    for (int i = 0; i < total; i++) close(theirs[i]);

    struct pollfd *pfd = calloc(total, sizeof *pfd);
    struct conn *c = calloc(total, sizeof *c);
    for (int i = 0; i < total; i++)
        c[i] = (struct conn){.fd = mine[i], .read_handler = handler, .last_active = 0, .timeout = 1000000};
    for (int i = 0; i < total; i++) pfd[i].fd = mine[i];
    int logfd = use_fsync ? open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0644) : -1;
    if (use_fsync && logfd < 0) die("open log");
    printf("ready %d\n", getpid());
    fflush(stdout);

    long tick = 0, served = 0;
    if (!use_fsync) {
        while (now() < until) {
            served += comm_select(pfd, c, total, ++tick);
        }
    } else {
        int ep = epoll_create1(0);
        for (int i = 0; i < total; i++) {
            struct epoll_event e = {.events = EPOLLIN, .data.fd = pfd[i].fd};
            epoll_ctl(ep, EPOLL_CTL_ADD, pfd[i].fd, &e);
        }
        struct epoll_event ev[64];
        while (now() < until) {
            int n = epoll_wait(ep, ev, 64, 200);
            for (int i = 0; i < n; i++) { serve_one(ev[i].data.fd, logfd); served++; }
        }
    }
    kill(kid, SIGTERM);
    waitpid(kid, NULL, 0);
    if (logfd >= 0) { close(logfd); unlink(logpath); }
    fprintf(stderr, "served %ld requests\n", served);
    return 0;
}

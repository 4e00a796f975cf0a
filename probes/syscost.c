/*
 * syscost: the CPU cost of the two kernel paths a tracer can slow down for
 * every task on the host, measured in CPU time (not wall time), so that
 * other work on a shared host preempting us does not count.
 *
 *   syscost syscall N SAMPLES   ns of CPU per getppid() (the syscall entry/exit path)
 * Every unit runs on the first CPU the process may use.
 *   syscost switch  N SAMPLES   ns of CPU per pipe round trip between two processes
 *                               on one CPU (two context switches, four syscalls;
 *                               on two CPUs a round trip would be a cross-CPU
 *                               wake-up or an idle exit, a different cost each time)
 *   syscost exchange N SAMPLES  ns of CPU per one-byte TCP round trip between two
 *                               processes on one CPU over loopback: the pipe round
 *                               trip's two switches and four syscalls, plus TCP's
 *                               send and receive paths (tcp_probe and
 *                               tcp_rcv_space_adjust fire in it)
 *   syscost connect N SAMPLES   ns of CPU per loopback TCP connection opened,
 *                               accepted and reset by this one process (six
 *                               syscalls; on loopback the handshake and the reset
 *                               run inline, in this task, so every TCP state change
 *                               of both ends is on its CPU time)
 *
 * Prints one JSON document: {"mode": ..., "ns": [per-sample ns per operation]}.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double cpu_ns(clockid_t clk)
{
    struct timespec t;
    clock_gettime(clk, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static double one_syscall_sample(long n)
{
    double t0 = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < n; i++)
        syscall(SYS_getppid);
    return (cpu_ns(CLOCK_THREAD_CPUTIME_ID) - t0) / n;
}

/* n one-byte round trips to a child that echoes them (it reads cr, writes cw; we write pw, read pr),
   then the child sends its own CPU time: ns of CPU of both per round trip, or -1. */
static double round_trips(int pw, int pr, int cr, int cw, long n)
{
    char c = 'x';
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        double t0 = cpu_ns(CLOCK_PROCESS_CPUTIME_ID);
        for (long i = 0; i < n; i++)
            if (read(cr, &c, 1) != 1 || write(cw, &c, 1) != 1)
                _exit(1);
        double used = cpu_ns(CLOCK_PROCESS_CPUTIME_ID) - t0;
        if (write(cw, &used, sizeof used) != (ssize_t)sizeof used)
            _exit(1);
        _exit(0);
    }
    double t0 = cpu_ns(CLOCK_PROCESS_CPUTIME_ID), child = -1;
    for (long i = 0; i < n; i++)
        if (write(pw, &c, 1) != 1 || read(pr, &c, 1) != 1)
            break;
    double mine = cpu_ns(CLOCK_PROCESS_CPUTIME_ID) - t0;
    if (read(pr, &child, sizeof child) != (ssize_t)sizeof child)
        child = -1;
    waitpid(pid, NULL, 0);
    return child < 0 ? -1 : (mine + child) / n;
}

static double one_switch_sample(long n)
{
    int to_child[2], to_parent[2];
    if (pipe(to_child) || pipe(to_parent))
        return -1;
    double v = round_trips(to_child[1], to_parent[0], to_child[0], to_parent[1], n);
    close(to_child[0]); close(to_child[1]); close(to_parent[0]); close(to_parent[1]);
    return v;
}

/* A connected loopback pair (TCP_NODELAY: each byte leaves at once), or -1s. */
static int tcp_pair(int fds[2])
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
    fds[0] = fds[1] = -1;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1) || getsockname(l, (struct sockaddr *)&a, &len)
        || (fds[0] = socket(AF_INET, SOCK_STREAM, 0)) < 0 || connect(fds[0], (struct sockaddr *)&a, sizeof a)
        || (fds[1] = accept(l, NULL, NULL)) < 0) {
        if (l >= 0)
            close(l);
        return -1;
    }
    close(l);
    setsockopt(fds[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fds[1], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 0;
}

/* The pipe round trip of one_switch_sample over a TCP pair instead. */
static double one_exchange_sample(long n)
{
    int fds[2];
    if (tcp_pair(fds))
        return -1;
    double v = round_trips(fds[0], fds[0], fds[1], fds[1], n);
    close(fds[0]);
    close(fds[1]);
    return v;
}

/* Reset (SO_LINGER 0) rather than closed: no TIME-WAIT piles up over the samples. */
static double one_connect_sample(long n)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    struct linger reset = {1, 0};
    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 128)
        || getsockname(l, (struct sockaddr *)&a, &len)) {
        if (l >= 0)
            close(l);
        return -1;
    }
    double t0 = cpu_ns(CLOCK_PROCESS_CPUTIME_ID), used = -1;
    long i;
    for (i = 0; i < n; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0)
            break;
        int s = connect(c, (struct sockaddr *)&a, sizeof a) ? -1 : accept(l, NULL, NULL);
        if (s < 0 || setsockopt(c, SOL_SOCKET, SO_LINGER, &reset, sizeof reset)) {
            close(c);
            if (s >= 0)
                close(s);
            break;
        }
        close(c);
        close(s);
    }
    if (i == n)
        used = (cpu_ns(CLOCK_PROCESS_CPUTIME_ID) - t0) / n;
    close(l);
    return used;
}

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[1], "syscall") && strcmp(argv[1], "switch") && strcmp(argv[1], "connect")
                      && strcmp(argv[1], "exchange"))) {
        fprintf(stderr, "usage: syscost syscall|switch|exchange|connect N SAMPLES\n");
        return 2;
    }
    long n = atol(argv[2]);
    int samples = atoi(argv[3]);
    if (n <= 0 || samples <= 0 || samples > 10000) {
        fprintf(stderr, "syscost: N and SAMPLES must be positive (SAMPLES <= 10000)\n");
        return 2;
    }
    int sw = !strcmp(argv[1], "switch"), conn = !strcmp(argv[1], "connect"), ex = !strcmp(argv[1], "exchange");
    /* Every unit on one CPU, the same for every run: the first this process may use. Unpinned, the off and
       on blocks of one measurement landed on CPUs that ran getppid() at 215 and 280 ns (a shared VM), and
       the difference read as the tracer's cost; pinned to the CPU it happened to start on, a round trip
       moved between runs the same way. */
    cpu_set_t allowed, one;
    int cpu = 0;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
        while (cpu < CPU_SETSIZE - 1 && !CPU_ISSET(cpu, &allowed))
            cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one))
        perror("syscost: sched_setaffinity (round trips may cross CPUs)");
    printf("{\"mode\": \"%s\", \"n\": %ld, \"ns\": [", argv[1], n);
    for (int s = 0; s < samples; s++) {
        double v = sw ? one_switch_sample(n) : ex ? one_exchange_sample(n) : conn ? one_connect_sample(n)
                 : one_syscall_sample(n);
        if (v < 0) {
            fprintf(stderr, "syscost: %s failed\n", conn || ex ? "a loopback connection" : "pipe/fork");
            return 1;
        }
        printf("%s%.2f", s ? ", " : "", v);
    }
    printf("]}\n");
    return 0;
}

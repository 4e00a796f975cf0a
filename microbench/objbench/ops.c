/* Every store operation done with plain blocking system calls: what the
 * sync engine does inline and each thread of the aufs-like pool does. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "objbench.h"

static ssize_t write_all(int fd, const char *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, buf + done, len - done);
        if (n < 0)
            return -errno;
        done += n;
    }
    return done;
}

static ssize_t read_all(int fd, char *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = read(fd, buf + done, len - done);
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        done += n;
    }
    return done;
}

void op_run_blocking(int dirfd, struct op *op)
{
    int fd;
    switch (op->kind) {
    case OP_FILE_WRITE:
        fd = openat(dirfd, op->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            op->result = -errno;
            return;
        }
        op->result = write_all(fd, op->buf, op->len);
        close(fd);
        return;
    case OP_FILE_READ:
        fd = openat(dirfd, op->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            op->result = -errno;
            return;
        }
        op->result = read_all(fd, op->buf, op->len);
        close(fd);
        return;
    case OP_UNLINK:
        op->result = unlinkat(dirfd, op->path, 0) ? -errno : 0;
        return;
    case OP_PWRITE:
        op->result = pwrite(op->fd, op->buf, op->len, op->off);
        if (op->result < 0)
            op->result = -errno;
        return;
    case OP_PREAD:
        op->result = pread(op->fd, op->buf, op->len, op->off);
        if (op->result < 0)
            op->result = -errno;
        return;
    }
}

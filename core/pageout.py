"""Give a finished compiler's pages back: process_madvise(MADV_PAGEOUT) over a child's private,
read-only file mappings.

bpftrace links LLVM and clang and touches ~60 MiB of their code to compile a program; attached,
it only reads its maps and prints, and never runs them again, yet the pages stay in its RSS
(~110 MiB for the doctor's program, 70 MiB of it these clean library pages). Advised to page
them out, the kernel unmaps them and drops them from the page cache: clean, they cost no
write, and a fault reads one back if it is ever needed. mm/madvise.c skips a page another
process maps too (a second bpftrace on the host keeps them for both), and process_madvise
needs Linux 5.10 and CAP_SYS_NICE: without either the RSS stays as it was, which is said
(None), never an error. Only private, read-only mappings of a file that hold no anonymous page
(smaps): a RELRO segment's copied pages, a writable mapping's or shared memory would, without
swap, not go, and with swap be read back at each dump.
"""

import ctypes
import os

from .numbers import uint

SYS_PROCESS_MADVISE = 440      # the same number on every architecture (the unified table from 424 on)
MADV_PAGEOUT = 21
IOV_MAX = 1024


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def file_ranges(smaps: bytes) -> list[tuple[int, int]]:
    """(start, length) of each private, read-only mapping of a file with no anonymous page, from
    /proc/PID/smaps (bytes: a file name is not text; only a newline is escaped in it)."""
    out, vma = [], None
    for line in smaps.split(b"\n"):
        head = line.split(maxsplit=5)
        if len(head) >= 5 and b"-" in head[0] and len(head[1]) == 4:          # a mapping's first line
            if vma:
                out.append(vma)
            vma = _candidate(head)
        elif vma and line.startswith((b"Anonymous:", b"Shmem")) and len(head) >= 2 and head[1] != b"0":
            vma = None
    if vma:
        out.append(vma)
    return out


def _candidate(head: list[bytes]) -> tuple[int, int] | None:
    perms = head[1]
    if b"w" in perms or not perms.endswith(b"p") or len(head) < 6 or not head[5].startswith(b"/") \
            or uint(head[4].decode("ascii", "replace")) in (None, 0):
        return None
    lo, _, hi = head[0].partition(b"-")
    try:
        start, end = int(lo, 16), int(hi, 16)
    except ValueError:
        return None
    return (start, end - start) if end > start else None


def page_out_files(pid: int) -> int | None:
    """Advise the kernel to page out `pid`'s file_ranges(). The caller's own unreaped, running
    child only: its pid cannot be another process's while it is not waited for. Bytes advised, or
    None where nothing was (the kernel or our privileges do not allow it, the child is gone)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
    try:
        with open(f"/proc/{pid}/smaps", "rb") as f:
            ranges = file_ranges(f.read())
        return _advise(pidfd, ranges) or None
    except (OSError, ValueError, AttributeError):
        return None
    finally:
        os.close(pidfd)


def _advise(pidfd: int, ranges: list[tuple[int, int]]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    done = 0
    for i in range(0, len(ranges), IOV_MAX):
        chunk = ranges[i:i + IOV_MAX]
        iov = (_Iovec * len(chunk))(*[_Iovec(lo, n) for lo, n in chunk])
        r = libc.syscall(ctypes.c_long(SYS_PROCESS_MADVISE), ctypes.c_int(pidfd), iov,
                         ctypes.c_size_t(len(chunk)), ctypes.c_int(MADV_PAGEOUT), ctypes.c_uint(0))
        if r < 0:          # ENOSYS, EPERM (no CAP_SYS_NICE), ESRCH (gone), ENOMEM (a range unmapped since)
            return done
        done += r
        if r < sum(n for _, n in chunk):      # stopped inside the chunk (the kernel caps one call's bytes)
            return done
    return done

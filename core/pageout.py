"""Give a finished compiler's pages back: process_madvise(MADV_PAGEOUT) over a child's read-only
file mappings.

bpftrace links LLVM and clang and touches ~60 MiB of their code to compile a program; attached,
it only reads its maps and prints, and never runs them again, yet the pages stay in its RSS
(~110 MiB for the doctor's program, 70 MiB of it these clean library pages). Advised to page
them out, the kernel unmaps them and drops them from the page cache: clean, they cost no
write, and a fault reads one back if it is ever needed. mm/madvise.c skips a page another
process maps too (a second bpftrace on the host keeps them for both), and process_madvise
needs Linux 5.10 and CAP_SYS_NICE: without either the RSS stays as it was, which is said
(None), never an error. Only read-only mappings: a writable one's touched pages are anonymous
copies, which without swap cannot go and with swap would be read back at each dump.
"""

import ctypes
import os

from .numbers import uint

SYS_PROCESS_MADVISE = 440      # the same number on every architecture (the unified table from 424 on)
MADV_PAGEOUT = 21
IOV_MAX = 1024


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def readonly_file_ranges(maps_text: str) -> list[tuple[int, int]]:
    """(start, length) of each mapping of a file that is not writable, from /proc/PID/maps."""
    out = []
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or "w" in fields[1] or not fields[5].startswith("/") or uint(fields[4]) in (None, 0):
            continue
        start, _, end = fields[0].partition("-")
        try:
            lo, hi = int(start, 16), int(end, 16)
        except ValueError:
            continue
        if hi > lo:
            out.append((lo, hi - lo))
    return out


def page_out_files(pid: int) -> int | None:
    """Advise the kernel to page out `pid`'s read-only file mappings. The caller's own unreaped
    child only: its pid cannot be another process's while it is not waited for. Bytes advised,
    or None where the kernel or our privileges do not allow it (or the child is gone)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        try:
            with open(f"/proc/{pid}/maps") as f:
                ranges = readonly_file_ranges(f.read())
        except OSError:
            return None
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        done = 0
        for i in range(0, len(ranges), IOV_MAX):
            chunk = ranges[i:i + IOV_MAX]
            iov = (_Iovec * len(chunk))(*[_Iovec(lo, n) for lo, n in chunk])
            r = libc.syscall(ctypes.c_long(SYS_PROCESS_MADVISE), ctypes.c_int(pidfd), iov,
                             ctypes.c_size_t(len(chunk)), ctypes.c_int(MADV_PAGEOUT), ctypes.c_uint(0))
            if r < 0:       # ENOSYS, EPERM (no CAP_SYS_NICE), ESRCH (gone), ENOMEM (a range unmapped since)
                return done or None
            done += r
        return done
    finally:
        os.close(pidfd)

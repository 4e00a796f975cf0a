"""core/pageout.py: a child's read-only file pages given back to the kernel (the watcher's bpftrace
after it attached: its LLVM and clang pages). The maps parsing is checked on text; one test maps a
file of our own in a child (its sole mapper, so the kernel may take its pages) and reads the child's
RSS before and after; one gives back an attached bpftrace's compiler pages, those no other process
maps (smaps' Private_Clean: another bpftrace on the host shares them, and the kernel keeps those)."""

import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import threading

import pytest

from conftest import IS_ROOT
from proxytune.core import pageout, procgroup

MIB = 1 << 20

SMAPS = b"""\
55d0a000-55d0b000 r--p 00000000 fe:01 1311 /usr/bin/bpftrace
Rss:                   4 kB
Anonymous:             0 kB
55d0b000-55d9b000 r-xp 00001000 fe:01 1311 /usr/bin/bpftrace
Anonymous:             0 kB
VmFlags: rd ex mr mw me
55d9b000-55d9c000 r--p 00091000 fe:01 1311 /usr/lib/libLLVM.so (relro)
Anonymous:             4 kB
55d9c000-55d9d000 rw-p 00092000 fe:01 1311 /usr/bin/bpftrace
55d9d000-55dbc000 rw-p 00000000 00:00 0 [heap]
7f00a000-7f00b000 r--p 00000000 00:00 0
7f10a000-7f20a000 r-xp 00000000 fe:01 2277 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Anonymous:             0 kB
7f30a000-7f30b000 r--s 00000000 00:05 9 /dev/zero (deleted)
7f40a000-7f40b000 r--p 00000000 00:00 0 [vvar]
7f50a000-7f50b000 r--p 00000000 fe:01 77 /tmp/a name\rffff0000-ffff9000 r-xp 0 fe:01 1 /x
Anonymous:             0 kB
bad line
"""


def test_only_private_read_only_file_mappings_without_anonymous_pages_are_given_back():
    ranges = pageout.file_ranges(SMAPS)
    assert ranges == [(0x55d0a000, 0x1000), (0x55d0b000, 0x90000), (0x7f10a000, 0x100000), (0x7f50a000, 0x1000)]
    # the RELRO copy (anonymous pages), the writable, the shared and the nameless ones are left alone,
    # and a name holding a carriage return makes no range of its own
    assert pageout.file_ranges(b"\xff\xfe not a mapping\n") == []


def _disk_backed(path) -> bool:
    """A directory whose pages are the page cache of a disk (not tmpfs: shmem has no clean file pages)."""
    out = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() not in ("tmpfs", "ramfs")


def _status(pid: int) -> dict[str, int]:
    """VmRSS, RssFile and friends of /proc/PID/status, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            m = re.match(r"(\w+):\s+(\d+) kB", line)
            if m:
                out[m.group(1)] = int(m.group(2)) * 1024
    return out


def _private_clean_files(pid: int) -> int:
    """Bytes of clean file pages only `pid` maps, in its read-only file mappings (smaps)."""
    total, readonly_file = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                readonly_file = len(head) >= 6 and "w" not in head[1] and head[5].startswith("/")
            elif readonly_file and head[0] == "Private_Clean:":
                total += int(head[1]) * 1024
    return total


@pytest.mark.skipif(not IS_ROOT, reason="needs root (CAP_SYS_NICE for process_madvise)")
def test_a_childs_clean_file_pages_leave_its_rss(tmp_path):
    if not _disk_backed(tmp_path):
        pytest.skip(f"{tmp_path} is not on a disk: its file pages are shared memory")
    data = tmp_path / "blob"
    with open(data, "wb") as f:
        f.write(os.urandom(32 * MIB))
        f.flush()
        os.fsync(f.fileno())                   # clean pages: the kernel drops them without writing
    child = subprocess.Popen(
        [sys.executable, "-c", "import mmap, sys\n"
         f"f = open({str(data)!r}, 'rb')\n"           # private and read-only, as a library's code is mapped
         "m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)\n"
         "sum(m[i] for i in range(0, len(m), 4096)); print('mapped', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "mapped"
        before = _status(child.pid)
        assert before["RssFile"] >= 32 * MIB
        advised = pageout.page_out_files(child.pid)
        after = _status(child.pid)
        assert advised is not None and advised >= 32 * MIB
        assert after["RssFile"] <= before["RssFile"] - 30 * MIB, (before, after)
        assert after["RssAnon"] <= before["RssAnon"] + MIB      # anonymous memory is not touched
        child.stdin.write("\n")
        child.stdin.close()
        assert child.wait(timeout=30) == 0                      # and the child runs on
    finally:
        procgroup.kill(child)


def test_a_pid_that_is_no_process_gives_back_nothing():
    assert pageout.page_out_files(2 ** 22 + 1) is None          # above pid_max's ceiling


def _lines(proc) -> "queue.Queue[str]":
    """The child's stdout lines, read by a thread: a get() with a timeout never hangs the suite."""
    q: queue.Queue[str] = queue.Queue()

    def pump():
        for line in proc.stdout:
            q.put(line)
        q.put("")
    threading.Thread(target=pump, daemon=True).start()
    return q


def _compiler_libraries() -> list[str]:
    """The real paths of the LLVM and clang libraries bpftrace links."""
    out = subprocess.run(["ldd", shutil.which("bpftrace")], capture_output=True, text=True, check=True).stdout
    return sorted({os.path.realpath(m) for m in re.findall(r"=> (\S*lib(?:LLVM|clang)\S*)", out)})


@pytest.mark.skipif(not (IS_ROOT and shutil.which("bpftrace") and shutil.which("unshare")),
                    reason="needs root, bpftrace and unshare")
def test_an_attached_bpftrace_gives_back_its_compiler_pages_and_keeps_tracing(tmp_path):
    """Its own copies of the libraries (bind-mounted in a mount namespace of its own), so no other
    bpftrace on the host maps the same pages and the kernel may take them all."""
    libs = _compiler_libraries()
    if not libs:
        pytest.skip("this bpftrace links no LLVM or clang library (static?): nothing of a compiler to give back")
    if not _disk_backed(tmp_path):
        pytest.skip(f"{tmp_path} is not on a disk: copies there would be shared memory")
    binds = []
    for i, lib in enumerate(libs):
        copy = tmp_path / f"lib{i}.so"
        shutil.copyfile(lib, copy)
        with open(copy, "rb") as f:
            os.fsync(f.fileno())           # clean pages, as an installed library's are
        binds.append(f"mount --bind {shlex.quote(str(copy))} {shlex.quote(lib)}")
    prog = (f"tracepoint:syscalls:sys_enter_getppid /pid == {os.getpid()}/ {{ @n = count(); }}\n"
            "interval:ms:500 { print(@n); }\n")
    tracer = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               " && ".join(binds) + ' && exec bpftrace -f json -e "$0"', prog],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = _lines(tracer)
    try:
        first = lines.get(timeout=120)
        assert "attached_probes" in first, (first, tracer.stderr.read()[-500:] if tracer.poll() is not None else "")
        private = _private_clean_files(tracer.pid)
        before = _status(tracer.pid)
        assert private >= 20 * MIB, private                         # the compile touched its libraries
        assert pageout.page_out_files(tracer.pid)
        after = _status(tracer.pid)
        assert _private_clean_files(tracer.pid) <= 2 * MIB
        assert after["VmRSS"] <= before["VmRSS"] - (private - 2 * MIB), (private, before, after)
        for _ in range(5):
            os.getppid()
        counts = []
        while not counts or counts[-1] < 5:                          # still tracing: the calls are counted
            m = re.search(r'"@n": (\d+)', lines.get(timeout=30))
            counts += [int(m.group(1))] if m else []
    finally:
        procgroup.kill(tracer)

"""core/pageout.py: a child's read-only file pages given back to the kernel (the watcher's bpftrace
after it attached: its LLVM and clang pages). The maps parsing is checked on text; one test maps a
file of our own in a child (its sole mapper, so the kernel may take its pages) and reads the child's
RSS before and after; one gives back an attached bpftrace's compiler pages, those no other process
maps (smaps' Private_Clean: another bpftrace on the host shares them, and the kernel keeps those)."""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import IS_ROOT, wait_for
from proxytune.core import pageout, procgroup

MIB = 1 << 20

MAPS = """\
55d0a000-55d0b000 r--p 00000000 fe:01 1311 /usr/bin/bpftrace
55d0b000-55d9b000 r-xp 00001000 fe:01 1311 /usr/bin/bpftrace
55d9b000-55d9c000 rw-p 00091000 fe:01 1311 /usr/bin/bpftrace
55d9c000-55dbc000 rw-p 00000000 00:00 0 [heap]
7f00a000-7f00b000 r--p 00000000 00:00 0
7f10a000-7f20a000 r-xp 00000000 fe:01 2277 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
7f30a000-7f30b000 r--s 00000000 00:05 9 /dev/zero (deleted)
7f40a000-7f40b000 r--p 00000000 00:00 0 [vvar]
bad line
"""


def test_only_read_only_mappings_of_files_are_given_back():
    ranges = pageout.readonly_file_ranges(MAPS)
    assert ranges == [(0x55d0a000, 0x1000), (0x55d0b000, 0x90000), (0x7f10a000, 0x100000), (0x7f30a000, 0x1000)]


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
    data = tmp_path / "blob"
    with open(data, "wb") as f:
        f.write(os.urandom(32 * MIB))
        f.flush()
        os.fsync(f.fileno())                   # clean pages: the kernel drops them without writing
    child = subprocess.Popen(
        [sys.executable, "-c", "import mmap, sys\n"
         f"f = open({str(data)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
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
    assert libs, "bpftrace links no LLVM or clang library"
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
    try:
        assert wait_for(lambda: "attached_probes" in (tracer.stdout.readline() or "attached_probes"), timeout=120)
        assert tracer.poll() is None, tracer.stderr.read()[-500:]
        private = _private_clean_files(tracer.pid)
        before = _status(tracer.pid)
        assert private >= 20 * MIB, private                         # the compile touched its libraries
        assert pageout.page_out_files(tracer.pid)
        after = _status(tracer.pid)
        assert _private_clean_files(tracer.pid) <= 2 * MIB
        assert after["VmRSS"] <= before["VmRSS"] - (private - 2 * MIB), (private, before, after)
        for _ in range(5):
            os.getppid()
        assert wait_for(lambda: '"@n": 5' in (tracer.stdout.readline() or ""), timeout=30)   # still tracing
    finally:
        procgroup.kill(tracer)

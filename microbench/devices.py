"""Sandboxes for the storage bench: sparse images on loop devices, mounted
with chosen options, and the safety checks a raw device must pass.

Everything made here is recorded and removed in reverse order when the
Sandbox closes, also on Ctrl-C (SIGINT) and SIGTERM, which are turned into
KeyboardInterrupt so that the `finally` runs; what a SIGKILLed run left is
removed by the next one. The raw device's checks live in rawdev.py.
"""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from proxytune.core import rundir
from proxytune.core.capability import Capability
from proxytune.core.errors import ProxytuneError

from . import rawdev

MKFS = {"ext2": ["mkfs.ext2", "-q", "-F"], "ext4": ["mkfs.ext4", "-q", "-F"], "xfs": ["mkfs.xfs", "-q", "-f"],
        "btrfs": ["mkfs.btrfs", "-q", "-f"]}
# ext4 mounted noinit_itable: the kernel's ext4lazyinit thread then does not zero a new ext4's inode
# tables in the background after its first mount (Documentation/admin-guide/ext4.rst, init_itable):
# writes no phase makes, on the device a phase counts. 2026-11-28: a noatime hit phase that makes 5
# writes made 23, 8 MB (a report at 02:33 UTC), and 1 of 8 in a check at 05:14; rare: lazy init, mkfs
# -E lazy_itable_init=0 and noinit_itable interleaved, 4 rounds each (05:38), showed none, and no speed
# between them (fill medians 6,263-6,511 objects/s; the 40 % two sequential runs showed was the host's drift).
MOUNT_EXTRA = {"ext4": "noinit_itable"}
FS_PACKAGES = {"xfs": "xfsprogs", "btrfs": "btrfs-progs"}
TEMP_PREFIX = "proxytune-storage-"
# io_uring closes a killed process's files from a kernel worker, a moment after the process is reaped:
# until then its mount is busy and its loop device open. Cleanup waits this long for them.
SETTLE_S = 10.0


def _run(argv, **kw) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise ProxytuneError(f"{' '.join(argv)} failed: {(p.stderr or p.stdout).strip()[-200:]}")
    return p.stdout


def mkfs_available(fs: str) -> Capability:
    """Whether this filesystem can be made here (its mkfs installed, as root, when missing)."""
    if shutil.which(MKFS[fs][0]):
        return Capability(True, f"{MKFS[fs][0]} found")
    pkg = FS_PACKAGES.get(fs, "e2fsprogs")
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", pkg], capture_output=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if shutil.which(MKFS[fs][0]):
            return Capability(True, f"{MKFS[fs][0]} installed (Debian package {pkg})")
    return Capability(False, f"{MKFS[fs][0]} not found (Debian package {pkg})")


class Sandbox(rundir.InRunDir):
    """Temp dir, loop devices and mounts of one bench run; close() undoes all of it.

    The dir is a rundir.RunDir: if this run is SIGKILLed, the next one finds
    its owner gone and removes what it left (reap_leftovers)."""

    def __init__(self):
        super().__init__("storage", before_remove=reap_leftovers)
        self.loops: list[str] = []
        self.mounts: list[Path] = []
        self.extra: dict[Path, str] = {}

    def loop(self, size_mb: int, name: str) -> str:
        """A loop device over a sparse file, with direct I/O so the host's page cache stays out."""
        img = self.dir / f"{name}.img"
        with open(img, "wb") as fh:
            fh.truncate(size_mb << 20)
        dev = _run(["losetup", "--find", "--show", "--direct-io=on", str(img)]).strip()
        self.loops.append(dev)
        return dev

    def fresh(self, fs: str, size_mb: int, name: str, options: str) -> tuple[str, Path]:
        """A filesystem made on a new loop device and mounted: empty and cold in a few ms. Never
        made again on a device that was mounted: a mount namespace created meanwhile (a service's
        PrivateTmp, a test's unshare -m) keeps an unmounted filesystem alive, and mkfs refuses it."""
        dev = self.loop(size_mb, name)
        self.mkfs(fs, dev)
        self.extra[self.dir / name] = MOUNT_EXTRA.get(fs, "")
        return dev, self.mount(dev, name, options)

    def discard(self, dev: str, mp: Path) -> None:
        """Unmount, detach and delete a fresh() filesystem: freeing its image is cheaper than
        unlinking a store's thousands of files one by one (most of a second per run)."""
        self.umount(mp)
        subprocess.run(["losetup", "-d", dev], capture_output=True)   # held elsewhere: detached on last close
        self.loops.remove(dev)
        self.extra.pop(mp, None)
        (self.dir / f"{mp.name}.img").unlink(missing_ok=True)

    def mkfs(self, fs: str, dev: str) -> None:
        _run(MKFS[fs] + [dev])

    def mount(self, dev: str, name: str, options: str) -> Path:
        mp = self.dir / name
        mp.mkdir(exist_ok=True)
        _run(["mount", "-o", self._options(mp, options), dev, str(mp)])
        self.mounts.append(mp)
        return mp

    def remount_cold(self, dev: str, mp: Path, options: str) -> None:
        """Unmount and mount again: the filesystem's page cache is dropped, nothing else on the host."""
        self.umount(mp)
        _run(["mount", "-o", self._options(mp, options), dev, str(mp)])
        self.mounts.append(mp)

    def _options(self, mp: Path, options: str) -> str:
        """The caller's mount options and the filesystem's own (MOUNT_EXTRA), for a fresh() one."""
        return ",".join(filter(None, (options, self.extra.get(mp))))

    def umount(self, mp: Path) -> None:
        umount_patiently(str(mp))               # a busy umount left it mounted, and the remount stacked on it
        if mp in self.mounts:
            self.mounts.remove(mp)

    def close(self) -> None:
        for mp in reversed(self.mounts):
            umount_patiently(str(mp))
        self.mounts.clear()
        for dev in reversed(self.loops):
            detach_patiently(dev)
        self.loops.clear()


def mount_points() -> list[str]:
    return [rawdev.unescape(line.split()[4]) for line in Path("/proc/self/mountinfo").read_text().splitlines()]


def umount_patiently(mp: str) -> None:
    """umount, retrying while it is busy for SETTLE_S; then detach it lazily."""
    deadline = time.monotonic() + SETTLE_S
    while mp in mount_points():
        if subprocess.run(["umount", mp], capture_output=True).returncode == 0:
            return
        if time.monotonic() >= deadline:
            subprocess.run(["umount", "-l", mp], capture_output=True)
            return
        time.sleep(0.1)


def detach_patiently(dev: str) -> None:
    """losetup -d only marks a device still open to detach on its last close: wait for that."""
    backing = Path("/sys/block") / Path(dev).name / "loop" / "backing_file"
    try:
        ours = backing.read_text()
    except OSError:
        return
    subprocess.run(["losetup", "-d", dev], capture_output=True)
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        try:
            if backing.read_text() != ours:         # another run's image now: ours is gone
                return
        except OSError:
            return
        time.sleep(0.1)


def reap_leftovers(d: Path) -> list[str]:
    """Unmount what a dead run mounted under d and detach the loop devices over its images."""
    said = []
    inside = f"{d}/"
    for mp in sorted((p for p in mount_points() if p.startswith(inside)), key=len, reverse=True):
        umount_patiently(mp)
        said.append(f"unmounted {mp}")
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if backing.read_text().strip().startswith(inside):
                dev = f"/dev/{backing.parent.parent.name}"
                detach_patiently(dev)
                said.append(f"detached {dev}")
        except OSError:
            continue
    return said


def run_child(argv: list[str], timeout: int) -> subprocess.CompletedProcess:
    """Run a command in its own process group; on any exception (Ctrl-C included)
    kill the whole group, so no grandchild (objbench under perf) keeps a mount busy."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)

"""Sandboxes for the storage bench: sparse images on loop devices, mounted
with chosen options, and the safety checks a raw device must pass.

Everything made here is recorded and removed in reverse order when the
Sandbox closes, also on Ctrl-C (SIGINT) and SIGTERM, which are turned into
KeyboardInterrupt so that the `finally` runs.
"""

import os
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

from tune.errors import ProxytuneError

MKFS = {"ext2": ["mkfs.ext2", "-q", "-F"], "ext4": ["mkfs.ext4", "-q", "-F"], "xfs": ["mkfs.xfs", "-q", "-f"],
        "btrfs": ["mkfs.btrfs", "-q", "-f"]}
FS_PACKAGES = {"xfs": "xfsprogs", "btrfs": "btrfs-progs"}
TEMP_PREFIX = "proxytune-storage-"


def _run(argv, **kw) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise ProxytuneError(f"{' '.join(argv)} failed: {(p.stderr or p.stdout).strip()[-200:]}")
    return p.stdout


def mkfs_available(fs: str) -> str | None:
    """None when this filesystem can be made here, else why not."""
    if shutil.which(MKFS[fs][0]):
        return None
    pkg = FS_PACKAGES.get(fs, "e2fsprogs")
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", pkg], capture_output=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if shutil.which(MKFS[fs][0]):
            return None
    return f"{MKFS[fs][0]} not found (Debian package {pkg})"


class Sandbox:
    """Temp dir, loop devices and mounts of one bench run; close() undoes all of it."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
        self.loops: list[str] = []
        self.mounts: list[Path] = []
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old[sig] = signal.signal(sig, _interrupt)
        return self

    def __exit__(self, *exc):
        self.close()
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        return False

    def loop(self, size_mb: int, name: str) -> str:
        """A loop device over a sparse file, with direct I/O so the host's page cache stays out."""
        img = self.dir / f"{name}.img"
        with open(img, "wb") as fh:
            fh.truncate(size_mb << 20)
        dev = _run(["losetup", "--find", "--show", "--direct-io=on", str(img)]).strip()
        self.loops.append(dev)
        return dev

    def mkfs(self, fs: str, dev: str) -> None:
        _run(MKFS[fs] + [dev])

    def mount(self, dev: str, name: str, options: str) -> Path:
        mp = self.dir / name
        mp.mkdir(exist_ok=True)
        _run(["mount", "-o", options, dev, str(mp)])
        self.mounts.append(mp)
        return mp

    def remount_cold(self, dev: str, mp: Path, options: str) -> None:
        """Unmount and mount again: the filesystem's page cache is dropped, nothing else on the host."""
        self.umount(mp)
        _run(["mount", "-o", options, dev, str(mp)])
        self.mounts.append(mp)

    def umount(self, mp: Path) -> None:
        subprocess.run(["umount", str(mp)], capture_output=True)
        if mp in self.mounts:
            self.mounts.remove(mp)

    def close(self) -> None:
        for mp in reversed(self.mounts):
            if subprocess.run(["umount", str(mp)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(mp)], capture_output=True)     # busy: detach it anyway
        self.mounts.clear()
        for dev in reversed(self.loops):
            subprocess.run(["losetup", "-d", dev], capture_output=True)
        self.loops.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def device_problems(dev: str) -> list[str]:
    """Why writing to `dev` could destroy data: mounted, held, swap, or carrying a signature."""
    problems = []
    try:
        st = os.stat(dev)
    except FileNotFoundError:
        return [f"{dev} does not exist"]
    if not stat.S_ISBLK(st.st_mode):
        return [f"{dev} is not a block device"]
    real = os.path.realpath(dev)
    name = Path(real).name
    majmin = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[2] == majmin:
            problems.append(f"{dev} is mounted on {fields[4]}")
    if any(line.split()[0] == real for line in Path("/proc/swaps").read_text().splitlines()[1:]):
        problems.append(f"{dev} is in use as swap")
    sysdir = Path("/sys/class/block") / name
    holders = sorted(p.name for p in (sysdir / "holders").glob("*")) if sysdir.exists() else []
    if holders:
        problems.append(f"{dev} is held by {', '.join(holders)} (LVM, md or dm)")
    children = [p.name for p in sysdir.glob(f"{name}*")] if sysdir.exists() else []
    for child in children:
        cdev = f"/dev/{child}"
        if os.path.exists(cdev):
            problems += [p.replace(cdev, f"its partition {cdev}") for p in device_problems(cdev)]
    sigs = subprocess.run(["wipefs", "--no-act", "--noheadings", "--output", "TYPE", dev], capture_output=True, text=True)
    if sigs.returncode != 0:
        problems.append(f"cannot read {dev}'s signatures (wipefs: {sigs.stderr.strip()[-80:]})")
    found = sorted({t.strip() for t in sigs.stdout.splitlines() if t.strip()})
    if found:
        problems.append(f"{dev} carries a signature ({', '.join(found)}): it holds a filesystem or partition table")
    return problems


def check_device(dev: str, force: bool) -> None:
    problems = device_problems(dev)
    if problems and not force:
        raise ProxytuneError(f"refusing to write to {dev}: {problems[0]}",
                             "pick an unused device, or pass --force-destroy-data if its contents may be destroyed")
    if any("does not exist" in p or "not a block device" in p for p in problems):
        raise ProxytuneError(f"cannot use {dev}: {problems[0]}")


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

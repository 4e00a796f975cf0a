"""Snapshots of everything a proxytune run could touch, for adversarial tests.

A test takes `SandboxState.take(root, ...)` before a hostile run and again
after it, and asserts the two are equal (or differ exactly as documented):
files under the sandbox root with content hash, mode, owner and link target;
sysctls read in the namespace the test runs in; mounts; loop devices; and the
proxytune-* leftovers in the temp directory.
"""

import hashlib
import os
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


def tree_state(root: Path) -> dict[str, tuple]:
    """path -> (type, mode, uid, gid, sha256 or link target) for every entry under root."""
    root = Path(root)
    out = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            mode = stat.S_IMODE(st.st_mode)
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", mode, st.st_uid, st.st_gid, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", mode, st.st_uid, st.st_gid, None)
            elif not stat.S_ISREG(st.st_mode):     # a FIFO or device: never read it (it may block)
                out[rel] = ("special", mode, st.st_uid, st.st_gid, stat.S_IFMT(st.st_mode), st.st_rdev)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                out[rel] = ("file", mode, st.st_uid, st.st_gid, digest)
    return out


def sysctls(names: list[str]) -> dict[str, str | None]:
    """Values of /proc/sys entries as this process sees them (None when absent)."""
    out = {}
    for name in names:
        try:
            out[name] = " ".join(Path("/proc/sys", name.replace(".", "/")).read_text().split())
        except OSError:
            out[name] = None
    return out


def mounts() -> list[str]:
    return sorted(Path("/proc/self/mounts").read_text().splitlines())


def loop_devices() -> list[str]:
    res = subprocess.run(["losetup", "-a"], capture_output=True, text=True)
    return sorted(res.stdout.splitlines()) if res.returncode == 0 else []


def temp_leftovers(prefix: str = "proxytune") -> list[str]:
    return sorted(p.name for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(prefix))


@dataclass
class SandboxState:
    files: dict = field(default_factory=dict)
    sysctl: dict = field(default_factory=dict)
    mounts: list = field(default_factory=list)
    loops: list = field(default_factory=list)
    tmp: list = field(default_factory=list)

    @classmethod
    def take(cls, *roots: Path, sysctl_names: tuple[str, ...] = ()) -> "SandboxState":
        files = {}
        for root in roots:
            files.update({f"{root}/{k}": v for k, v in tree_state(root).items()})
        return cls(files=files, sysctl=sysctls(list(sysctl_names)), mounts=mounts(),
                   loops=loop_devices(), tmp=temp_leftovers())

    def diff(self, other: "SandboxState") -> list[str]:
        """Human-readable differences, empty when the two states are identical."""
        out = []
        for key in sorted(set(self.files) | set(other.files)):
            if self.files.get(key) != other.files.get(key):
                out.append(f"file {key}: {self.files.get(key)} -> {other.files.get(key)}")
        for key in sorted(set(self.sysctl) | set(other.sysctl)):
            if self.sysctl.get(key) != other.sysctl.get(key):
                out.append(f"sysctl {key}: {self.sysctl.get(key)} -> {other.sysctl.get(key)}")
        for name in ("mounts", "loops", "tmp"):
            before, after = set(getattr(self, name)), set(getattr(other, name))
            out += [f"{name} added: {x}" for x in sorted(after - before)]
            out += [f"{name} removed: {x}" for x in sorted(before - after)]
        return out

"""Build the C harnesses with cc, cached: rebuilt only when a source, the
flags or the compiler change. Binaries live in microbench/build/."""

import hashlib
import shutil
import subprocess
from pathlib import Path

from tune.errors import ProxytuneError

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build"
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]
LIBURING_HEADER = Path("/usr/include/liburing.h")

HARNESSES = {
    # name: (source directory, extra flags when available, libraries)
    "evbench": ("evbench", ["-pthread"]),
    "fdscan": ("fdscan", []),
    "objbench": ("objbench", ["-pthread"]),
}


def _flags(name: str) -> tuple[list[str], list[str]]:
    extra, libs = list(HARNESSES[name][1]), []
    if name in ("evbench", "objbench") and LIBURING_HEADER.exists():
        extra.append("-DHAVE_LIBURING")
        libs.append("-luring")
    if name == "objbench":
        libs.append("-lm")
    return extra, libs


def compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise ProxytuneError("no C compiler found", "Debian: apt-get install build-essential")
    return cc


def build(name: str) -> Path:
    """Path to the built harness, compiling it first if anything changed."""
    src_dir = HERE / HARNESSES[name][0]
    sources = sorted(src_dir.glob("*.c"))
    headers = sorted(src_dir.glob("*.h"))
    extra, libs = _flags(name)
    cc = compiler()
    key = hashlib.sha256()
    for f in sources + headers:
        key.update(f.name.encode() + f.read_bytes())
    key.update(" ".join([cc] + CFLAGS + extra + libs).encode())
    key.update(subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.encode())
    out = BUILD / f"{name}-{key.hexdigest()[:12]}"
    if out.exists():
        return out
    BUILD.mkdir(exist_ok=True)
    cmd = [cc, *CFLAGS, *extra, "-o", str(out), *map(str, sources), *libs]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ProxytuneError(f"building {name} failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr else ''}",
                             " ".join(cmd))
    for old in BUILD.glob(f"{name}-*"):
        if old != out:
            old.unlink()
    return out

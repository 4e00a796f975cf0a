"""The C compiler and flags every program of ours is built with (the
benchmarks' harnesses, the doctor's syscost helper): C11, -O2, all warnings;
warnings are errors only when PROXYTUNE_WERROR=1 (the tests set it), so a
newer compiler on a user's host does not break a run."""

import os
import shutil

from .errors import ProxytuneError

CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra"]


class NoCompiler(ProxytuneError):
    """No C compiler on this host."""


def compiler() -> str:
    """$CC when set (as make does), else cc, gcc or clang from PATH."""
    wanted = os.environ.get("CC")
    cc = shutil.which(wanted) if wanted else shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise NoCompiler(f"no C compiler found{f' (CC={wanted!r})' if wanted else ''}",
                         "Debian: apt-get install build-essential")
    return cc


def cflags() -> list[str]:
    return CFLAGS + (["-Werror"] if os.environ.get("PROXYTUNE_WERROR") == "1" else [])

"""Where shipped data lives and where built things go, in every layout.

Shipped data (profiles, bpftrace scripts, C sources, lua) sits next to the
code in a checkout and in the wheel; the Debian package moves it to
/usr/share/proxytune. Built harnesses go to a cache directory owned by the
user, never next to installed code.
"""

import os
from pathlib import Path

from proxytune.core.errors import ProxytuneError

from . import files

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def _share_dir() -> Path | None:
    """usr/share/proxytune for a package at usr/lib/python3/dist-packages/proxytune
    (relative, so an unpacked .deb finds its own data too)."""
    parents = PACKAGE_ROOT.parents
    return parents[3] / "share" / "proxytune" if len(parents) > 3 else None


def data_root() -> Path:
    """Next to the code (checkout, wheel) when the profiles are there, else the
    Debian package's share directory: all shipped data lives in one of the two."""
    share = _share_dir()
    if not (PACKAGE_ROOT / "profiles").is_dir() and share is not None and (share / "profiles").is_dir():
        return share
    return PACKAGE_ROOT


def shipped(*parts: str) -> Path:
    """A shipped data file or directory, e.g. shipped("profiles") or shipped("probes")."""
    return data_root().joinpath(*parts)


def cache_dir() -> Path:
    """PROXYTUNE_CACHE_DIR, else /var/cache/proxytune as root, else
    $XDG_CACHE_HOME/proxytune (~/.cache/proxytune); created 0700 and refused
    unless it and every parent is a real directory that nobody else can write
    (files.private_dir)."""
    if os.environ.get("PROXYTUNE_CACHE_DIR"):
        path = Path(os.environ["PROXYTUNE_CACHE_DIR"])
    elif os.geteuid() == 0:
        path = Path("/var/cache/proxytune")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(base) / "proxytune"
    if not path.is_absolute():
        raise ProxytuneError(f"cache directory must be an absolute path, not {str(path)!r}")
    try:
        # a link is taken where it points now (~/.cache may be one): every component of that is vetted
        return files.private_dir(Path(os.path.realpath(path)))     # root runs what is built there
    except ProxytuneError as e:
        raise ProxytuneError(f"build cache: {e.message}",
                             "remove it, or set PROXYTUNE_CACHE_DIR to a private directory") from None

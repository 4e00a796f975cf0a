"""Runs on each fleet host, before proxytune itself: the standard library
only (the host may lack click, rich and jsonschema yet).

It vets the state directory (ours, nobody else can write it or any parent),
verifies the shipped tarball against the digest the controller computed,
unpacks it into a fresh private directory and renames that into place under
a name no earlier run used. Nothing already on the host is trusted because it
exists: a directory planted where a bundle goes is never run.

    python3 fleet_unpack.py STATE_DIR BUNDLE_ID SHA256 UPLOAD_DIR
    python3 fleet_unpack.py --missing [--no-install]

BUNDLE_ID is the tarball digest's first 16 hex digits plus a per-run token;
UPLOAD_DIR (the private temp dir the tarball was copied to) is removed.
Exit 0 unpacked, 2 refused (one line on stderr), 3 unpacked but Python
modules proxytune needs are missing (their Debian packages on stdout).
"""

import hashlib
import importlib.util
import os
import re
import shutil
import stat
import sys
import tarfile
import tempfile
import time

BUNDLE_ID = re.compile(r"[0-9a-f]{16}-[0-9a-f]{12}")
SHA256 = re.compile(r"[0-9a-f]{64}")
TARBALL = "proxytune.tar.gz"
MEMBER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*(/[A-Za-z0-9_][A-Za-z0-9_.+-]*)*")
NEEDS = {"click": "python3-click", "rich": "python3-rich", "jsonschema": "python3-jsonschema"}
STALE_SECONDS = 24 * 3600


class Refused(Exception):
    pass


def vet_path(path: str) -> None:
    """Every directory from / down to path: a real directory owned by root or
    us, writable by nobody else (a sticky root-owned /tmp is fine for parents)."""
    me = os.geteuid()
    where = "/"
    parts = [p for p in os.path.abspath(path).split("/") if p]
    for i, part in enumerate([""] + parts):
        where = os.path.join(where, part) if part else "/"
        st = os.lstat(where)
        last = i == len(parts)
        if not stat.S_ISDIR(st.st_mode):
            raise Refused(f"{where} is not a directory (a symlink?)")
        if st.st_uid not in (0, me):
            raise Refused(f"{where} is owned by uid {st.st_uid}, not root")
        sticky = st.st_mode & stat.S_ISVTX and st.st_uid == 0 and not last
        if st.st_mode & 0o022 and not sticky:
            raise Refused(f"{where} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})")


def private_dir(path: str) -> None:
    """path exists as a directory of ours, mode 0700 (made so if absent)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
        raise Refused(f"{path} must be a directory owned by root, mode 0700 "
                      f"(it is uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")


def verify(tarball: str, sha: str) -> None:
    h = hashlib.sha256()
    with open(tarball, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != sha:
        raise Refused(f"the shipped bundle does not match its digest {sha[:16]}")


def checked_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Regular files and directories with plain relative names; anything else refuses the bundle."""
    members = tar.getmembers()
    for m in members:
        if not (m.isreg() or m.isdir()) or not MEMBER.fullmatch(m.name) or ".." in m.name.split("/"):
            raise Refused(f"the bundle holds {m.name!r}, which is not a plain file")
        m.mode &= 0o755
    return members


def unpack(fleet: str, bundle_id: str, tarball: str) -> str:
    """Into a fresh 0700 directory, then renamed to fleet/bundle-ID (which must not exist)."""
    final = os.path.join(fleet, f"bundle-{bundle_id}")
    fresh = tempfile.mkdtemp(prefix=".unpack-", dir=fleet)
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            tar.extractall(fresh, members=checked_members(tar), numeric_owner=True)
        os.chmod(fresh, 0o700)
        if os.path.lexists(final):
            raise Refused(f"{final} exists already: this run's bundle name was taken")
        os.rename(fresh, final)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    return final


def remove_stale(fleet: str, keep: str) -> None:
    """Bundles and half-unpacked dirs older than a day (runs that were killed)."""
    now = time.time()
    for name in os.listdir(fleet):
        path = os.path.join(fleet, name)
        if path == keep or not name.startswith(("bundle-", ".unpack-")):
            continue
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and now - st.st_mtime > STALE_SECONDS:
            shutil.rmtree(path, ignore_errors=True)


def missing_packages() -> list[str]:
    return [pkg for mod, pkg in NEEDS.items() if importlib.util.find_spec(mod) is None]


def say_missing(argv: list[str]) -> int:
    """`--missing [--no-install]`: one line naming what is still missing, exit 3; else 0."""
    missing = missing_packages()
    if missing:
        why = "--no-install: not installed" if "--no-install" in argv else "still missing after apt"
        print(f"proxytune needs the Debian packages {' '.join(missing)} on this host ({why})", file=sys.stderr)
        return 3
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--missing"]:
        return say_missing(argv)
    if len(argv) != 4 or not BUNDLE_ID.fullmatch(argv[1]) or not SHA256.fullmatch(argv[2]) \
            or not argv[1].startswith(argv[2][:16]):
        print("usage: fleet_unpack.py STATE_DIR BUNDLE_ID SHA256 UPLOAD_DIR", file=sys.stderr)
        return 2
    state_dir, bundle_id, sha, upload = argv
    try:
        vet_path(upload)
        verify(os.path.join(upload, TARBALL), sha)
        vet_path(os.path.dirname(os.path.abspath(state_dir)))
        if not os.path.lexists(state_dir):
            os.mkdir(state_dir, 0o700)
        vet_path(state_dir)
        os.chmod(state_dir, 0o700, follow_symlinks=False)      # as proxytune's journal keeps it
        fleet = os.path.join(state_dir, "fleet")
        private_dir(fleet)
        final = unpack(fleet, bundle_id, os.path.join(upload, TARBALL))
        remove_stale(fleet, final)
    except (Refused, OSError, tarfile.TarError) as e:
        print(f"proxytune bundle refused: {e}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(upload, ignore_errors=True)
    missing = missing_packages()
    if missing:
        print(" ".join(missing))
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

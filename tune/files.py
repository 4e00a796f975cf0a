"""The one safe file layer: every file proxytune writes or edits goes through here.

Why it is this careful: it runs as root on a host where someone with a
local foothold may have planted a symlink where our file goes, or swapped a
directory for one. So every path is walked from its root one directory at a
time with O_NOFOLLOW (a symlinked component is refused, not followed), and
every later operation uses the opened directory's fd, so a swap after the
check cannot redirect it. Writes are atomic (a temp file created
O_EXCL|O_NOFOLLOW in the same directory, fsync, mode and owner set, rename,
fsync the directory): after a crash the file is the old one or the new one.
A rewritten file keeps the mode and owner it had; a new file gets
NEW_FILE_MODE (0644, a config file). Directories we create (0755) are
returned so that rollback can remove them again, if still empty.
"""

import errno
import hashlib
import os
import re
import secrets
import stat
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from proxytune.core.errors import ProxytuneError

NEW_FILE_MODE = 0o644
NEW_DIR_MODE = 0o755
PRIVATE_DIR_MODE = 0o700
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class FileState:
    """What a file is: its text and the identity it must keep."""
    text: str
    mode: int
    uid: int
    gid: int
    sha256: str

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict | None) -> "FileState | None":
        return None if doc is None else cls(**doc)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def read_for_edit(path: Path, root: Path = Path("/")) -> FileState | None:
    """The file as it is now, or None when absent; refuses a symlink or a non-regular file."""
    try:
        with _parent(path, root, create=False) as (dfd, name, _):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise _refusal(path, e, "read")
    st = _must_be_regular(fd, f"refusing to edit {path}: not a regular file")
    with os.fdopen(fd, "rb") as fh:
        try:
            text = fh.read().decode()
        except UnicodeDecodeError:
            raise ProxytuneError(f"refusing to edit {path}: it is not UTF-8 text", "nothing was changed")
    return FileState(text, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, digest(text))


def write(path: Path, text: str, like: FileState | None = None, root: Path = Path("/"),
          mode: int = NEW_FILE_MODE) -> list[str]:
    """Atomically replace (or create) `path` with `text`, keeping `like`'s mode and owner
    (else `mode`, owned by us). Returns the directories it had to create, outermost first."""
    try:
        with _parent(path, root, create=True) as (dfd, name, created):
            _replace_in(dfd, name, path, text, like, mode)
            return created
    except ProxytuneError:
        raise
    except OSError as e:
        raise _refusal(path, e)


def write_output(path: Path, data: str | bytes, mode: int = NEW_FILE_MODE, keep: bool = False) -> Path:
    """A report, result or export at a path the user named (relative to the working directory,
    which another user may own): no symlink followed on the way, written atomically, into a
    directory that is ours (made PRIVATE_DIR_MODE when we make it) and that no one else can write
    (a sticky one like /tmp aside: no one can rename our file there). keep: a file there keeps its
    mode and owner (the admin's chmod of a textfile; by fstat: nothing of it is read), unless another
    user could have put it there (a sticky directory others write: its owner, or whoever can write
    the file it is a hard link to, would get our file to rewrite at will). Returns the path."""
    path = _absolute(path)
    try:
        with _parent(path, Path("/"), create=True, dir_mode=PRIVATE_DIR_MODE) as (dfd, name, _):
            _refuse_foreign_dir(dfd, path.parent, sticky_ok=True)
            # in a directory others write, what is there may be theirs: a planted file, or a hard link to
            # any file they can write (root's 0666 one too): nothing of it is kept there
            like = _identity_of(dfd, name) if keep and not _open_to_others(os.fstat(dfd)) else None
            _replace_in(dfd, name, path, data, like, mode)
    except ProxytuneError:
        raise
    except OSError as e:
        raise _refusal(path, e)
    return path


def check_output(path: Path) -> None:
    """write_output's refusals without writing: checked for every file of a report before the first
    is written, so a refusal leaves nothing half-done. A missing directory is fine (it will be ours)."""
    path = _absolute(path)
    try:
        with _parent(path, Path("/"), create=False) as (dfd, name, _):
            _refuse_foreign_dir(dfd, path.parent, sticky_ok=True)
            _refuse_non_file(dfd, name, path)
    except FileNotFoundError:
        return
    except ProxytuneError:
        raise
    except OSError as e:
        raise _refusal(path, e)


def write_outputs(files: dict[Path, str | bytes], own_tree: bool = False, keep: bool = False) -> list[Path]:
    """Several outputs as one: every one checked (check_output, and with own_tree refuse_foreign_tree)
    before the first is written, so a refusal changes nothing; a failure after that names what was
    written already. Returns the paths written."""
    for path in files:
        if own_tree:
            refuse_foreign_tree(path)
        check_output(path)
    written: list[Path] = []
    for path, data in files.items():
        try:
            written.append(write_output(path, data, keep=keep))
        except ProxytuneError as e:
            if not written:
                raise
            hint = re.sub(r";? *nothing was (changed|written)", "", e.hint or "").strip()
            raise ProxytuneError(e.message, "; ".join(filter(None, [hint, "already written: " +
                                                                     ", ".join(map(str, written))]))) from None
    return written


def refuse_foreign_tree(path: Path) -> None:
    """Refuse a path below a directory another user owns (`sudo -E` keeps the user's HOME): root would
    make their ~/.local/share its own, or leave root's files among theirs. Every existing directory on
    the way must be root's or ours; what is missing will be ours."""
    path = _absolute(path)
    for d in reversed(path.parents):
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            return
        except OSError as e:
            raise _refusal(path, e)
        if st.st_uid not in (0, os.geteuid()):
            raise ProxytuneError(f"refusing to write {path}: {d} belongs to uid {st.st_uid} ({_user(st.st_uid)}), "
                                 f"not to uid {os.geteuid()}",
                                 f"run it as {_user(st.st_uid)} (without sudo), or set XDG_DATA_HOME to a "
                                 "directory of yours; nothing was written")


def _user(uid: int) -> str:
    import pwd
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def private_dir(path: Path) -> Path:
    """A directory only we can change (a build cache, a state or work directory), made
    PRIVATE_DIR_MODE with its missing parents: every component is walked without following a
    symlink and must be owned by root or us and not writable by others (a sticky one like /tmp
    allowed, and then the directory itself must be 0700). The directory must be ours; an existing
    one keeps its mode (never a chmod of a directory we did not make). One clear refusal otherwise."""
    path = Path(path)
    if not path.is_absolute():
        raise ProxytuneError(f"refusing directory {path}: not an absolute path")
    sticky = []

    def vet(fd: int, where: Path) -> None:
        _refuse_foreign_dir(fd, where, sticky_ok=True)
        sticky.append(where != path and bool(os.fstat(fd).st_mode & 0o002))
    try:
        # the walk ends at path's own fd: "_" stands for a name inside it, never made
        with _parent(path / "_", Path("/"), create=True, dir_mode=PRIVATE_DIR_MODE, vet=vet) as (dfd, _, _):
            st = os.fstat(dfd)
            if st.st_uid != os.geteuid():
                raise ProxytuneError(f"refusing directory {path}: owned by uid {st.st_uid}, not by us",
                                     "remove it, or choose a directory of ours")
            _refuse_foreign_dir(dfd, path, sticky_ok=False)
            if any(sticky) and stat.S_IMODE(st.st_mode) & 0o077:
                raise ProxytuneError(f"refusing directory {path}: in a directory anyone can write, it must be "
                                     f"0700, not {stat.S_IMODE(st.st_mode):04o}", f"chmod 700 {path}")
    except ProxytuneError:
        raise
    except OSError as e:
        raise _refusal(path, e, "create")
    return path


def restore(path: Path, old: FileState | None, created_dirs: list[str] = (), root: Path = Path("/")) -> None:
    """Put a file back as it was (text, mode, owner), or remove it when it did not exist;
    then remove the directories the write created, if they are empty."""
    if old is not None:
        write(path, old.text, like=old, root=root)
        return
    try:
        with _parent(path, root, create=False) as (dfd, name, _):
            _refuse_non_file(dfd, name, path)
            _unlink_quietly(name, dfd)
            os.fsync(dfd)
    except FileNotFoundError:
        pass            # its directory is gone too: nothing to take back
    for d in reversed(list(created_dirs)):
        remove_empty_dir(Path(d), root)


def remove_empty_dir(path: Path, root: Path = Path("/")) -> bool:
    """rmdir without following links; False when it is not empty (someone put a file there)."""
    try:
        with _parent(path, root, create=False) as (dfd, name, _):
            os.rmdir(name, dir_fd=dfd)
            return True
    except FileNotFoundError:
        return True
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise _refusal(path, e)


# -- append-only files (the watcher's recorder) -------------------------------------------

_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_private_dir(path: Path) -> int:
    """An fd of a directory only we can change (made as private_dir() makes it), reopened from the
    root without following a symlink and vetted again on the fd: files kept open in it (a
    recorder's segments) are then made, read and removed relative to the directory that was
    checked, whatever is renamed around it later. The caller closes it."""
    path = private_dir(Path(path))
    try:
        with _parent(path / "_", Path("/"), create=False) as (dfd, _, _):
            fd = os.dup(dfd)
    except ProxytuneError:
        raise
    except OSError as e:
        raise _refusal(path, e, "open")
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise ProxytuneError(f"refusing directory {path}: it changed while it was checked", "nothing was written")
    return fd


def open_append(dfd: int, name: str, where: Path) -> int:
    """An fd that appends to `name` in the directory dfd, the file made 0600 when absent. Never
    through a symlink (O_NOFOLLOW); it must be a plain file of ours with one link (a hard link to
    another file would have us append to that one). `where` names it in a refusal."""
    _plain_name(name, where)
    try:
        fd = os.open(name, _APPEND_FLAGS, 0o600, dir_fd=dfd)
    except OSError as e:
        raise _refusal(where / name, e, "append to")
    _must_be_ours(fd, where / name)
    return fd


def open_read(dfd: int, name: str, where: Path) -> int | None:
    """An fd to read `name` in dfd (None when absent): never a symlink, a plain file of ours."""
    _plain_name(name, where)
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _refusal(where / name, e, "read")
    _must_be_ours(fd, where / name)
    return fd


def append(fd: int, data: bytes, sync: bool = True) -> None:
    """All of `data` at the end of the file, or none of it: a short or failed write (a full disk)
    is cut back to where it began before the OSError is raised, so a reader never meets a part
    of it that we left. sync: fdatasync, so that a crash loses at most this append."""
    start = os.lseek(fd, 0, os.SEEK_END)
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fdatasync(fd)
    except BaseException:           # a full disk, or Ctrl-C between two partial writes
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass            # a reader still drops it: records carry their length and checksum
        raise


def unlink_in(dfd: int, name: str, where: Path) -> None:
    """Remove `name` from dfd (absent is fine); never a directory, and never follows a link."""
    _plain_name(name, where)
    _refuse_non_file(dfd, name, where / name)
    _unlink_quietly(name, dfd)


def _plain_name(name: str, where: Path) -> None:
    if not name or name in (".", "..") or "/" in name or not name.isprintable():
        raise ProxytuneError(f"refusing the file name {name!r} in {where}: not a plain name")


def _must_be_ours(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        os.close(fd)
        raise ProxytuneError(f"refusing {path}: not a plain file of ours with one link",
                             "remove it; nothing was written")


def open_private(path: Path, flags: int = os.O_PATH) -> int:
    """An fd of `path` (O_NOFOLLOW: never a link), when its directory is ours alone: every component
    walked without following a link, owned by root or us and not writable by others (sticky aside),
    and its own directory ours with no access for group or others. Someone else's file (a socket a
    daemon listens on) cannot be there. ProxytuneError says why not; FileNotFoundError when absent."""
    path = _absolute(path)
    try:
        with _parent(path, Path("/"), create=False,
                     vet=lambda fd, where: _refuse_foreign_dir(fd, where, sticky_ok=True)) as (dfd, name, _):
            st = os.fstat(dfd)
            if st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise ProxytuneError(f"refusing {path}: its directory is not private to uid {os.geteuid()} "
                                     f"(owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except ProxytuneError:
        raise
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):
            raise                   # not there, or not ours to reach: nothing was refused
        raise _refusal(path, e, "open")


# -- thin wrappers kept for the backends (same protections) -------------------------------

def read_text(path: Path) -> str | None:
    """File content for parsing, or None when absent. Follows symlinks (a host's own links,
    like /etc/sysctl.d/99-sysctl.conf, are legitimate to read); never use it to edit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)   # a FIFO must not hang us
    except (FileNotFoundError, NotADirectoryError):
        return None
    _must_be_regular(fd, f"cannot read {path}: not a regular file")
    with os.fdopen(fd, "rb") as fh:
        try:
            return fh.read().decode()
        except UnicodeDecodeError:
            raise ProxytuneError(f"cannot read {path}: it is not UTF-8 text")


def atomic_write(path: Path, text: str, mode: int = NEW_FILE_MODE) -> list[str]:
    """write() keeping the identity of the file that is there now."""
    return write(path, text, like=read_for_edit(path), mode=mode)


# -- internals -----------------------------------------------------------------------------

def _absolute(path: Path) -> Path:
    """A path the user named, made absolute: getcwd() has no symlinks, and '..' is taken as written."""
    try:
        return Path(os.path.abspath(path))
    except FileNotFoundError:
        raise ProxytuneError(f"cannot write {path}: the working directory is gone", "cd to a directory, or give -o "
                             "an absolute path") from None


@contextmanager
def _parent(path: Path, root: Path, create: bool, dir_mode: int = NEW_DIR_MODE, vet=None):
    """(fd of path's directory, final name, created dirs), walked from root with O_NOFOLLOW;
    `vet(fd, path)` is called on every directory on the way, root and path's own included."""
    path, root = Path(path), Path(root)
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise ProxytuneError(f"refusing to write {path}: it is outside {root}")
    parts = rel.parts
    if not parts or ".." in parts:
        raise ProxytuneError(f"refusing to write {path}: not a file path below {root}")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    created, where = [], root
    try:
        if vet:
            vet(fd, where)
        for part in parts[:-1]:
            where = where / part
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, dir_mode, dir_fd=fd)
                created.append(str(where))
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.fchmod(nxt, dir_mode)        # whatever the umask
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(part, fd):
                    raise ProxytuneError(f"refusing to follow the symlink {where} (on the way to {path})",
                                         "replace the link with a real directory; nothing was changed")
                raise
            os.close(fd)
            fd = nxt
            if vet:
                vet(fd, where)
        yield fd, parts[-1], created
    finally:
        os.close(fd)


def _identity_of(dfd: int, name: str) -> FileState | None:
    """The mode and owner of the regular file `name` (not followed if a link), without reading it."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None                     # _replace_in refuses it
    return FileState("", stat.S_IMODE(st.st_mode) & 0o777, st.st_uid, st.st_gid, "")    # never a set-id bit


def _must_be_regular(fd: int, refusal: str) -> os.stat_result:
    """fstat of an open fd; closes it and refuses when it is not a regular file (FIFO, dir, device)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ProxytuneError(refusal, "replace it with a plain file; nothing was changed")
    return st


def _is_link(name: str, dfd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _refuse_non_file(dfd: int, name: str, path: Path) -> None:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise ProxytuneError(f"refusing to write through the symlink {path}",
                             "remove the link, or write elsewhere (--root, -o); nothing was changed")
    if not stat.S_ISREG(st.st_mode):
        raise ProxytuneError(f"refusing to write {path}: not a regular file", "nothing was changed")


def _open_to_others(st: os.stat_result) -> bool:
    """A directory anyone, or a group other than ours, can write."""
    return bool(st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != os.getegid()))


def _refuse_foreign_dir(dfd: int, where: Path, sticky_ok: bool) -> None:
    """A directory another user owns, or that others can write (group other than ours, or
    anyone) without the sticky bit, lets them swap what we put there: refused."""
    st = os.fstat(dfd)
    if st.st_uid not in (0, os.geteuid()):
        raise ProxytuneError(f"refusing to use {where}: it is owned by uid {st.st_uid}, not by root or us",
                             "use a directory of ours (for a report or result: -o DIR); nothing was written")
    if _open_to_others(st) and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        raise ProxytuneError(f"refusing to use {where}: it is writable by others",
                             "use a directory only we can write (for a report or result: -o DIR); "
                             "nothing was written")


def _replace_in(dfd: int, name: str, path: Path, data: str | bytes, like: FileState | None, mode: int) -> None:
    """Atomically put `data` at `name` in the open directory: temp file, fill, rename, fsync."""
    _refuse_non_file(dfd, name, path)
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        _fill(fd, data, like, mode)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        _unlink_quietly(tmp, dfd)
        raise
    os.fsync(dfd)


def _fill(fd: int, data: str | bytes, like: FileState | None, mode: int) -> None:
    """Write, fsync, then give the temp file its final mode and owner before it is renamed."""
    with os.fdopen(fd, "wb", closefd=True) as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())
        os.fchmod(fh.fileno(), like.mode if like else mode)
        if like and (like.uid, like.gid) != (os.geteuid(), os.getegid()):
            os.fchown(fh.fileno(), like.uid, like.gid)
            os.fchmod(fh.fileno(), like.mode)     # chown clears setuid/setgid bits


def _unlink_quietly(name: str, dfd: int) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass


def _refusal(path: Path, e: OSError, verb: str = "write") -> ProxytuneError:
    if e.errno == errno.ELOOP:
        return ProxytuneError(f"refusing to follow the symlink {path}",
                              "remove the link (or point --root elsewhere); nothing was changed")
    return ProxytuneError(f"cannot {verb} {path}: {e.strerror or e}",
                          "check the disk (full? read-only?) and permissions")

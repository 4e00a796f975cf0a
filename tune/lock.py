"""One writer at a time: apply and rollback hold the host's lock, then the state dir's.

flock(2) on a lock file: the kernel drops it when the holder exits, however
it exits (SIGKILL included), so a stale lock cannot exist. Two locks, taken
in this order:

- the host lock, LOCK_DIR/lock (/run/proxytune, root's and 0700; tests and
  image builders move it with PROXYTUNE_LOCK_DIR): live settings are the
  host's, whichever --state-dir a run journals into, so two applies with two
  state dirs must not run at once either;
- the state dir's lock, STATE_DIR/lock: its journal's sequence numbers.

The holder writes who it is (pid, start time, comm, command, state dir,
since) into each file so that a refused run can say who is in the way, and
empties it on release. Writing that note is best effort: a full or read-only
state filesystem must not stop a rollback. A host lock note left behind by a
killed run names an apply that may be half done in its state dir: until that
is rolled back, a run with another state dir is refused. Lock files are
opened O_NOFOLLOW, 0600, and must be ours.
"""

import errno
import fcntl
import json
import os
import stat
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from . import journal
from proxytune.core.errors import ProxytuneError
from proxytune.core.procfs import identity, same_process, started_at

LOCK_NAME = "lock"


@contextmanager
def hold(host, command: str):
    """Hold the host lock and the state dir's lock for `command` (e.g. "tune apply"); refuse
    at once, saying who is in the way, when another run holds either."""
    with ExitStack() as stack:
        if os.geteuid() == 0:     # a user's run can change only what it owns (its --root image), never the host
            lock_dir = journal.ensure_private_dir(Path(host.lock_dir), "the host lock directory")
            stack.enter_context(_held(lock_dir / LOCK_NAME, command, host.state_dir, "the host lock",
                                      host_wide=True))
        state_dir = journal.ensure_dirs(host.state_dir, journal_too=False)
        journal.vet_dir(journal.directory(state_dir))
        stack.enter_context(_held(state_dir / LOCK_NAME, command, host.state_dir, "the lock"))
        yield


@contextmanager
def _held(path: Path, command: str, state_dir: Path, what: str, host_wide: bool = False):
    """flock `path` exclusively, with our note in it while held. host_wide: a note a killed run
    left is checked first, and kept while its apply is still to be rolled back."""
    fd = _open(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ProxytuneError(f"{command} refused: {holder_text(_note(fd), what)}",
                                 "wait for it to finish (or stop it); nothing was changed")
        left = _note(fd) if host_wide else None
        _refuse_interrupted_elsewhere(left, state_dir, command)
        me = {**(identity(os.getpid()) or {"pid": os.getpid()}), "command": command,
              "state_dir": str(state_dir), "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _write_note(fd, json.dumps(me) + "\n")
        try:
            yield
        finally:           # empty whenever nobody holds it, unless a killed apply is still open
            _write_note(fd, json.dumps(left) + "\n" if _stuck_apply(left) else "")
    finally:
        os.close(fd)


def _open(path: Path) -> int:
    """The lock file, ours and plain; read-only when its filesystem is full or read-only (flock
    works on any open file, and a rollback must still run there)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            hint = ("its filesystem is read-only or full; nothing was changed" if e.errno in (errno.EROFS, errno.ENOSPC)
                    else "it must be a plain file owned by root")
            raise ProxytuneError(f"cannot open the lock {path}: {e.strerror}", hint) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise ProxytuneError(f"refusing the lock {path}: not a plain file owned by uid {os.geteuid()}",
                             "remove it; it is recreated")
    if stat.S_IMODE(st.st_mode) != 0o600:
        try:
            os.fchmod(fd, 0o600)
        except OSError:
            pass
    return fd


def _write_note(fd: int, text: str) -> None:
    try:
        os.ftruncate(fd, 0)
        if text:
            os.pwrite(fd, text.encode(), 0)
    except OSError:
        pass            # full or read-only: the lock holds all the same; only the note is missing


def _note(fd: int) -> dict | None:
    try:
        who = json.loads(os.pread(fd, 4096, 0).decode())
        return who if isinstance(who, dict) and isinstance(who.get("pid"), int) else None
    except (ValueError, OSError):
        return None


def holder_text(who: dict | None, what: str = "the lock") -> str:
    """'pid N (tune apply, comm, started T, state dir D) holds the lock since T', read defensively."""
    if who is None:
        return f"another proxytune run holds {what}"
    try:
        started = started_at(int(who["pid"])) if same_process(who) else None
        start = time.strftime(", started %Y-%m-%dT%H:%M:%SZ", time.gmtime(started)) if started else ""
        state = f", state dir {_clean(who['state_dir'], 200)}" if "state_dir" in who else ""
        return (f"pid {int(who['pid'])} ({_clean(who['command'], 40)}, {_clean(who.get('comm', '?'), 16)}"
                f"{start}{state}) holds {what} since {_clean(who['since'], 20)}")
    except (KeyError, TypeError, ValueError):
        return f"another proxytune run holds {what}"


def _stuck_apply(left: dict | None) -> dict | None:
    """The apply a run that is gone left 'applying' in the state dir its host lock note names."""
    if not left or not isinstance(left.get("state_dir"), str) or same_process(left):
        return None
    try:
        stuck = [e for e in journal.open_entries(Path(left["state_dir"])) if e["state"] == journal.APPLYING]
    except (ProxytuneError, OSError):
        return None
    return stuck[-1] if stuck else None


def _refuse_interrupted_elsewhere(left: dict | None, state_dir: Path, command: str) -> None:
    """A killed run's apply in another state dir may be half done: it is rolled back first.
    (In our own state dir the journal says so itself: apply refuses, rollback finishes it.)"""
    stuck = _stuck_apply(left)
    other = left and str(left.get("state_dir"))
    if stuck is None or os.path.realpath(other) == os.path.realpath(state_dir):
        return
    raise ProxytuneError(f"{command} refused: apply {stuck['id']} in the state dir {_clean(other, 200)} was "
                         f"interrupted (its pid {stuck['owner']['pid']} is gone) and may be half done",
                         f"run `proxytune --state-dir {_clean(other, 200)} tune rollback` first; nothing was changed")


def _clean(value, limit: int) -> str:
    """A field of a lock file fit for one line of output: printable, bounded."""
    return "".join(ch if ch.isprintable() else "?" for ch in str(value)[:limit])

"""One writer at a time: apply and rollback hold an exclusive lock in the state dir.

flock(2) on STATE_DIR/lock: the kernel drops it when the holder exits, however
it exits (SIGKILL included), so a stale lock cannot exist. The holder writes
who it is (pid, start time, comm, command, since) into the file so that a
refused second run can say who is in the way, and empties it on release. The file is opened
O_NOFOLLOW, 0600, and must be ours.
"""

import fcntl
import json
import os
import stat
import time
from contextlib import contextmanager
from pathlib import Path

from . import journal
from proxytune.core.errors import ProxytuneError
from proxytune.core.procfs import identity

LOCK_NAME = "lock"


@contextmanager
def hold(state_dir: Path, command: str):
    """Hold the lock for `command` (e.g. "tune apply"); refuse at once when another run holds it."""
    state_dir = journal.ensure_dirs(state_dir, journal_too=False)
    journal.vet_dir(journal.directory(state_dir))
    path = state_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise ProxytuneError(f"cannot open the lock {path}: {e.strerror}", "it must be a plain file owned by root")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise ProxytuneError(f"refusing the lock {path}: not a plain file owned by uid {os.geteuid()}",
                                 "remove it; it is recreated")
        os.fchmod(fd, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ProxytuneError(f"{command} refused: {holder_text(fd)}",
                                 "wait for it to finish (or stop it); nothing was changed")
        me = {**(identity(os.getpid()) or {"pid": os.getpid()}), "command": command,
              "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        try:
            yield me
        finally:
            os.ftruncate(fd, 0)          # empty whenever nobody holds it
    finally:
        os.close(fd)


def holder_text(fd: int) -> str:
    """'pid N (tune apply) holds the lock since T', read defensively from the lock file."""
    try:
        who = json.loads(os.pread(fd, 4096, 0).decode())
        return (f"pid {int(who['pid'])} ({_clean(who['command'], 40)}, {_clean(who.get('comm', '?'), 16)}) "
                f"holds the lock since {_clean(who['since'], 20)}")
    except (ValueError, KeyError, TypeError, OSError):
        return "another proxytune run holds the lock"


def _clean(value, limit: int) -> str:
    """A field of the lock file fit for one line of output: printable, bounded."""
    return "".join(ch if ch.isprintable() else "?" for ch in str(value)[:limit])

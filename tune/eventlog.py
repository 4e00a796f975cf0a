"""One structured line per apply and rollback where operators already look: the system
journal, or syslog where journald is absent.

Who did it (uid, user, SUDO_USER), what (profile, steps, journal entry) and how it ended
(result, and why when it failed) — so that an apply an ssh drop cut short, or one nobody
remembers, can be traced from `journalctl -t proxytune` or /var/log/syslog alone.

The line goes straight to the daemon's socket, no command run: journald's native protocol
(its fields are searchable: `journalctl PROXYTUNE_RESULT=failed`) at
/run/systemd/journal/socket, else a classic syslog datagram (RFC 3164) to /dev/log. Tests
and unusual hosts point them elsewhere with PROXYTUNE_JOURNAL_SOCKET and
PROXYTUNE_SYSLOG_SOCKET; such a socket is trusted only in a directory private to us (a
`sudo -E` keeps the variables: root's record must not go to a user's socket, nor to another
daemon's), opened once without following a link and sent to through that fd. Logging is best
effort: no logger, and no byte of SUDO_USER or of a path, ever stops an apply or a rollback
or turns a finished one into an error.
"""

import json
import os
import pwd
import re
import socket
import stat
import sys
from contextlib import contextmanager
from pathlib import Path

from proxytune.core.errors import Interrupted, ProxytuneError, one_line

from . import files

JOURNAL_SOCKET = "/run/systemd/journal/socket"
SYSLOG_SOCKET = "/dev/log"
IDENT = "proxytune"
NOTICE, WARNING = 5, 4
LOG_USER = 1 << 3
_BARE = re.compile(r"[A-Za-z0-9_.,:/@+-]+")


def who() -> dict:
    """The person behind this run: real uid and its name, and SUDO_USER when sudo started it."""
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    sudo = os.environ.get("SUDO_USER", "")
    return {"uid": uid, "user": user, **({"sudo_user": _text(sudo)[:64]} if sudo else {})}


@contextmanager
def recorded(action: str, host, profile: str = "?"):
    """Yield a dict the caller fills (`entry`, `steps`, `profile`); log one line when the block
    ends, however it ends."""
    rec = {"profile": profile, "steps": 0, "state_dir": str(host.state_dir)}
    try:
        yield rec
    except BaseException as e:
        entry = rec.pop("entry", None)
        result = "interrupted" if isinstance(e, (KeyboardInterrupt, Interrupted)) else "failed"
        record(action, {**rec, "result": result, **_entry_fields(entry),
                        "reason": getattr(e, "message", None) or str(e) or type(e).__name__}, WARNING)
        raise
    entry = rec.pop("entry", None)
    result = entry["state"] if entry else "unchanged"
    record(action, {**rec, "result": result, **_entry_fields(entry)}, NOTICE if result in ("applied", "rolled-back",
                                                                                            "unchanged") else WARNING)


def _entry_fields(entry: dict | None) -> dict:
    return {"journal": entry["id"], "done": entry["done"]} if entry else {}


def record(action: str, fields: dict, priority: int = NOTICE) -> None:
    """Send `proxytune action=... who... fields...` to the journal, else to syslog; never raises."""
    try:
        fields = {"action": action, **who(), **fields}
        message = " ".join(f"{k}={_value(v)}" for k, v in fields.items())
        if not _to_journal(message, fields, priority):
            _to_syslog(message, priority)
    except Exception as e:          # best effort: what was done is done, whatever the log says
        _warn(f"the {action} was not logged: {type(e).__name__}: {e}")


def _text(v) -> str:
    """One line of printable text, whatever bytes it came from (a non-UTF-8 byte is shown as \\udcXX)."""
    return one_line(str(v)).encode("utf-8", "backslashreplace").decode("utf-8")[:300]


def _value(v) -> str:
    text = _text(v)
    return text if _BARE.fullmatch(text) else json.dumps(text)


def _warn(text: str) -> None:
    """One line on stderr, if there is one (print to a closed stderr, None, would go to stdout)."""
    if sys.stderr is None:
        return
    try:
        print(f"proxytune: warning: {_text(text)}", file=sys.stderr)
    except Exception:
        pass


def _to_journal(message: str, fields: dict, priority: int) -> bool:
    lines = [f"MESSAGE={IDENT}: {message}", f"PRIORITY={priority}", f"SYSLOG_IDENTIFIER={IDENT}",
             f"SYSLOG_PID={os.getpid()}"]
    lines += [f"PROXYTUNE_{k.upper()}={_text(v)}" for k, v in fields.items()]
    return _send("PROXYTUNE_JOURNAL_SOCKET", JOURNAL_SOCKET, "\n".join(lines) + "\n")


def _to_syslog(message: str, priority: int) -> bool:
    return _send("PROXYTUNE_SYSLOG_SOCKET", SYSLOG_SOCKET, f"<{LOG_USER | priority}>{IDENT}[{os.getpid()}]: {message}")


def _send(variable: str, standard: str, text: str) -> bool:
    """The datagram to the standard socket, or to the one `variable` names if it is private to us."""
    named = os.environ.get(variable)
    try:
        fd = _private_socket(variable, named) if named else None
    except ProxytuneError as e:
        _warn(f"not logged to {variable}: {e.message}")
        return False
    if named and fd is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.settimeout(2)
            if fd is None and not stat.S_ISSOCK(os.stat(standard).st_mode):
                return False
            s.sendto(text.encode("utf-8", "backslashreplace"), f"/proc/self/fd/{fd}" if fd is not None else standard)
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def _private_socket(variable: str, path: str) -> int | None:
    """An O_PATH fd of the socket `path`, checked by that fd: ours, in a directory private to us; None when
    absent or out of reach; ProxytuneError when it is there but not to be trusted."""
    try:
        fd = files.open_private(Path(path))
    except OSError:             # absent, or not ours to reach (a root-only directory, seen by a user)
        return None
    st = os.fstat(fd)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise ProxytuneError(f"{path} is not a socket of uid {os.geteuid()}'s")
    return fd

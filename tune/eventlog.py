"""One structured line per apply and rollback where operators already look: the system
journal, or syslog where journald is absent.

Who did it (uid, user, SUDO_USER), what (profile, steps, journal entry) and how it ended
(result, and why when it failed) — so that an apply an ssh drop cut short, or one nobody
remembers, can be traced from `journalctl -t proxytune` or /var/log/syslog alone.

The line goes straight to the daemon's socket, no command run: journald's native protocol
(its fields are searchable: `journalctl PROXYTUNE_RESULT=failed`) at
/run/systemd/journal/socket, else a classic syslog datagram (RFC 3164) to /dev/log. Tests
and unusual hosts point them elsewhere with PROXYTUNE_JOURNAL_SOCKET and
PROXYTUNE_SYSLOG_SOCKET. Logging is best effort: no logger never stops an apply or a rollback.
"""

import json
import os
import pwd
import re
import socket
import stat
from contextlib import contextmanager

from proxytune.core.errors import Interrupted, one_line

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
    return {"uid": uid, "user": user, **({"sudo_user": one_line(sudo)[:64]} if sudo else {})}


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
    """Send `proxytune action=... who... fields...` to the journal, else to syslog."""
    fields = {"action": action, **who(), **fields}
    message = " ".join(f"{k}={_value(v)}" for k, v in fields.items())
    if not _to_journal(message, fields, priority):
        _to_syslog(message, priority)


def _value(v) -> str:
    text = one_line(str(v))[:300]
    return text if _BARE.fullmatch(text) else json.dumps(text)


def _ours(path: str) -> bool:
    """A log socket root may tell who applied what: a socket (links followed: /dev/log is one) that
    root or we own. A PROXYTUNE_*_SOCKET kept by `sudo -E` must not hand root's record to a user."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and st.st_uid in (0, os.geteuid())


def _to_journal(message: str, fields: dict, priority: int) -> bool:
    lines = [f"MESSAGE={IDENT}: {message}", f"PRIORITY={priority}", f"SYSLOG_IDENTIFIER={IDENT}",
             f"SYSLOG_PID={os.getpid()}"]
    lines += [f"PROXYTUNE_{k.upper()}={one_line(str(v))[:300]}" for k, v in fields.items()]
    return _send(os.environ.get("PROXYTUNE_JOURNAL_SOCKET") or JOURNAL_SOCKET, "\n".join(lines) + "\n")


def _to_syslog(message: str, priority: int) -> bool:
    return _send(os.environ.get("PROXYTUNE_SYSLOG_SOCKET") or SYSLOG_SOCKET,
                 f"<{LOG_USER | priority}>{IDENT}[{os.getpid()}]: {message}")


def _send(path: str, text: str) -> bool:
    if not _ours(path):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.settimeout(2)
            s.sendto(text.encode(), path)
        return True
    except OSError:
        return False

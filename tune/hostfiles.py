"""Reading the host's own config files as they really are: unreadable,
not UTF-8, or holding lines their consumer would reject.

Whatever cannot be read or parsed becomes a HostFileError naming
`FILE:LINE: reason`; plan turns it into status `error` for the setting it
concerns, so check, plan, apply and doctor keep working and say where.
"""

import os
import stat
from pathlib import Path

from proxytune.core.errors import BackendError

MAX_BYTES = 16 << 20        # far beyond any real config file


class HostFileError(BackendError):
    """A host file we cannot read, or a line in it we cannot parse."""

    def __init__(self, path, line: int | None, reason: str):
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {reason}", "fix or remove that line, or leave the setting out with --skip")
        self.path, self.line, self.reason = str(path), line, reason


def read(path: Path) -> str | None:
    """The file's text; None when it does not exist; HostFileError when it cannot be read,
    is not a regular file (a FIFO would block, /dev/zero never ends) or is implausibly large."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise HostFileError(path, None, f"cannot read: {e.strerror or e}")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HostFileError(path, None, "cannot read: not a regular file")
        chunks, size = [], 0
        while size <= MAX_BYTES and (chunk := os.read(fd, 1 << 20)):
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as e:
        raise HostFileError(path, None, f"cannot read: {e.strerror or e}")
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise HostFileError(path, None, f"cannot read: larger than {MAX_BYTES >> 20} MiB")
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise HostFileError(path, None, f"cannot read: not UTF-8 text (byte {e.start})")


def lines(text: str | None):
    """(line number, line) of a file's text, numbered from 1."""
    return enumerate((text or "").splitlines(), 1)

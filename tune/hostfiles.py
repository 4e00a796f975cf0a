"""Reading the host's own config files as they really are: unreadable,
not UTF-8, or holding lines their consumer would reject.

Whatever cannot be read or parsed becomes a HostFileError naming
`FILE:LINE: reason`; plan turns it into status `error` for the setting it
concerns, so check, plan, apply and doctor keep working and say where.
"""

from pathlib import Path

from .errors import BackendError


class HostFileError(BackendError):
    """A host file we cannot read, or a line in it we cannot parse."""

    def __init__(self, path, line: int | None, reason: str):
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {reason}", "fix or remove that line, or leave the setting out with --skip")
        self.path, self.line, self.reason = str(path), line, reason


def read(path: Path) -> str | None:
    """The file's text; None when it does not exist; HostFileError when it cannot be read."""
    try:
        return Path(path).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except UnicodeDecodeError as e:
        raise HostFileError(path, None, f"cannot read: not UTF-8 text (byte {e.start})")
    except OSError as e:
        raise HostFileError(path, None, f"cannot read: {e.strerror or e}")


def lines(text: str | None):
    """(line number, line) of a file's text, numbered from 1."""
    return enumerate((text or "").splitlines(), 1)

"""Atomic file writes, used for the journal and for every config file we edit.

write, fsync, rename, fsync the directory: after a crash the file is either
the old one or the new one, never half of each.
"""

import os
import tempfile
from pathlib import Path


def read_text(path: Path) -> str | None:
    """File content, or None when the file does not exist."""
    try:
        return Path(path).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def restore(path: Path, old: str | None) -> None:
    """Put a file back as it was: old content, or absent."""
    if old is None:
        try:
            Path(path).unlink()
            _fsync_dir(Path(path).parent)
        except (FileNotFoundError, NotADirectoryError):
            pass        # already absent: there is nothing to take back
    else:
        atomic_write(path, old)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

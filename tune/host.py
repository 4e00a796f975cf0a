"""Where proxytune reads and writes on this host.

`root` prefixes configuration files (/etc/...) so that tests and image
builders can work under a temporary tree; /proc and /sys are always the
live ones, because that is what a running kernel exposes. `state_dir` holds
the apply journal; `lock_dir` the host-wide lock of apply and rollback.
"""

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from .runner import CommandRunner

DEFAULT_STATE_DIR = "/var/lib/proxytune"
DEFAULT_LOCK_DIR = "/run/proxytune" if os.path.isdir("/run") else "/var/run/proxytune"


def _lock_dir() -> Path:
    """The host-wide lock's directory: one per host, whatever the state dir (tests and
    image builders move it with PROXYTUNE_LOCK_DIR)."""
    return Path(os.environ.get("PROXYTUNE_LOCK_DIR") or DEFAULT_LOCK_DIR)


@dataclass
class Host:
    root: Path = Path("/")
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    runner: CommandRunner = field(default_factory=CommandRunner)
    os: str = field(default_factory=lambda: platform.system().lower())
    lock_dir: Path = field(default_factory=_lock_dir)

    @classmethod
    def from_env(cls, root: str | None = None, state_dir: str | None = None) -> "Host":
        root = root or os.environ.get("PROXYTUNE_ROOT") or "/"
        state = state_dir or os.environ.get("PROXYTUNE_STATE_DIR") or DEFAULT_STATE_DIR
        return cls(root=Path(root), state_dir=Path(state))

    def path(self, absolute: str) -> Path:
        """A configuration file path under this host's root."""
        return self.root / absolute.lstrip("/")

    @property
    def live(self) -> bool:
        """True when config files are the running system's own."""
        return self.root.resolve() == Path("/")

"""Runs external commands (mount, sysctl, cap_mkdb); tests swap in their own.

FreeBSD backends are exercised on Linux by replacing the runner, so every
command a backend issues goes through here and nowhere else.
"""

import subprocess

from proxytune.core.errors import BackendError


class CommandRunner:
    """Run a command, return stdout; raise BackendError with its stderr on failure."""

    def __init__(self):
        self.history: list[list[str]] = []

    def run(self, argv: list[str], check: bool = True) -> str:
        self.history.append(list(argv))
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            raise BackendError(f"command not found: {argv[0]}")
        if check and proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip().splitlines()
            raise BackendError(f"{' '.join(argv)} failed: {msg[-1] if msg else proc.returncode}")
        return proc.stdout

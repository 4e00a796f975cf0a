"""Errors a user can act on: one line, an optional hint, exit code 2 (130 when interrupted).

The CLI prints a ProxytuneError as that line; anything else is a bug,
printed as one `internal error` line, exit 2, its traceback only with --debug.
"""

import re


# C0 and C1 controls, DEL, and what Python's splitlines() or a terminal also takes as a line
# break or a reordering (U+2028/2029, bidi overrides): none may pass in a name or a message.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def one_line(text: str) -> str:
    """Control characters (newline, tab, NUL, ESC ...) written as escapes, so a message stays one line."""
    return CONTROL.sub(lambda m: ascii(m.group())[1:-1], str(text))


class ProxytuneError(Exception):
    """A user-facing error: `message` is one line, `hint` says what to do."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        message = one_line(message)     # a hostile name inside must not start a second line
        super().__init__(message)
        self.message = message
        self.hint = hint and one_line(hint)


class Interrupted(ProxytuneError):
    """Ctrl-C or SIGTERM stopped a command (after it undid what it had done): exit 130."""
    exit_code = 130


class ProfileError(ProxytuneError):
    """A malformed profile, located as `file:line: key: problem`."""

    def __init__(self, path, line: int | None, key: str | None, problem: str):
        where = f"{path}:{line}" if line else str(path)
        what = f"{key}: {problem}" if key else problem
        super().__init__(f"{where}: {what}", "fix the profile; nothing was changed")
        self.path, self.line, self.key, self.problem = path, line, key, problem


class NotApplicable(Exception):
    """The knob does not exist here (other kernel, network namespace, no process)."""


class BackendError(ProxytuneError):
    """Reading or writing a knob failed on this host."""

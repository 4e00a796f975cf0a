"""Catching a stop signal without overriding whoever started us.

An ignored signal at start is a request: `nohup` ignores SIGHUP so that a
command outlives its terminal, and a shell ignores SIGINT for a background
job of a script. Python itself leaves an ignored SIGINT ignored; our SIGTERM
and SIGHUP handlers do the same (the classic `if (signal(s, SIG_IGN) !=
SIG_IGN)` idiom).
"""

import signal


def catch(signals, handler) -> dict:
    """Install handler for each signal that is not ignored now; {signal: previous handler} of
    those it installed, for the caller to restore."""
    saved = {}
    for s in signals:
        if signal.getsignal(s) is not signal.SIG_IGN:
            saved[s] = signal.signal(s, handler)
    return saved

"""Numbers in untrusted text (a proxy's config, a stats socket, a log, /proc, a saved journal):
ASCII digits only. str's isdigit also takes '³' and '١', which int() then refuses (a crash
on a hostile value) or reads as a number no one wrote ('١٠' is 10)."""

import re

DIGITS = re.compile("[0-9]+", re.ASCII)


def uint(text) -> int | None:
    """The number `text` is when it is ASCII digits and nothing else; None otherwise."""
    return int(text) if isinstance(text, str) and DIGITS.fullmatch(text) else None


def is_uint(text) -> bool:
    return uint(text) is not None


def leading_uint(text) -> int | None:
    """The leading ASCII digits of a value as an int ('4096;' is 4096, '³' is no number)."""
    m = DIGITS.match(text) if isinstance(text, str) else None
    return int(m.group(0)) if m else None

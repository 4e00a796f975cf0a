"""Assignment modes in one place: exact, at-least, at-most, covers.

Capacity knobs use at-least (or covers, for ranges) so that applying a
profile never lowers a value the host already has higher: tuned's
network-throughput profile lowered tcp_rmem on newer kernels; we don't.
"""

from .values import Value

MODES = ("value", "at_least", "at_most", "covers")
MODE_WORDS = {"value": "=", "at_least": ">=", "at_most": "<=", "covers": "covers"}


def _pairs(current: Value, wanted: Value):
    cur = current if isinstance(current, tuple) else (current,)
    want = wanted if isinstance(wanted, tuple) else (wanted,)
    if len(cur) != len(want) or not all(isinstance(x, int) for x in cur + want):
        raise ValueError(f"cannot compare {current!r} with {wanted!r}")
    return cur, want


INFINITE = ("unlimited", "infinity")


def satisfied(mode: str, current: Value, wanted: Value) -> bool:
    """Does the current value meet the wanted one under this mode?"""
    if mode == "value":
        return current == wanted
    if current in INFINITE:
        return mode == "at_least"
    cur, want = _pairs(current, wanted)
    if mode == "at_least":
        return all(c >= w for c, w in zip(cur, want))
    if mode == "at_most":
        return all(c <= w for c, w in zip(cur, want))
    if mode == "covers":
        return cur[0] <= want[0] and cur[1] >= want[1]
    raise ValueError(f"unknown mode {mode}")


def target(mode: str, current: Value, wanted: Value) -> Value:
    """The value to write: the wanted one, never moving a knob the wrong way."""
    if mode == "value" or current is None or current in INFINITE:
        return wanted
    cur, want = _pairs(current, wanted)
    if mode == "at_least":
        out = tuple(max(c, w) for c, w in zip(cur, want))
    elif mode == "at_most":
        out = tuple(min(c, w) for c, w in zip(cur, want))
    elif mode == "covers":
        out = (min(cur[0], want[0]), max(cur[1], want[1]))
    else:
        raise ValueError(f"unknown mode {mode}")
    return out if isinstance(wanted, tuple) else out[0]


def describe(mode: str, wanted: Value) -> str:
    from .values import render
    text = render(wanted)
    return text if mode == "value" else f"{MODE_WORDS[mode]} {text}"

"""One representation for knob values, so every backend compares alike.

A value is an int, a tuple of ints (port ranges, tcp_rmem), a bool (mount
flags) or a str (anything else). Kernel text such as "32768\t60999" and
profile values such as [1024, 65535] or "1024 65535" parse to the same thing.
"""

Value = int | tuple | bool | str


def parse(raw) -> Value:
    """Normalise a profile value or a kernel string."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int):
        return raw
    if isinstance(raw, (list, tuple)):
        if all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
            return tuple(raw) if len(raw) != 1 else raw[0]
        raise ValueError(f"expected a list of integers, got {list(raw)!r}")
    if isinstance(raw, str):
        parts = raw.split()
        if parts and all(_is_int(p) for p in parts):
            nums = tuple(int(p) for p in parts)
            return nums[0] if len(nums) == 1 else nums
        return raw.strip()
    raise ValueError(f"unsupported value type {type(raw).__name__}")


def render(value: Value, sep: str = " ") -> str:
    """Kernel/config text for a value (inverse of parse)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple):
        return sep.join(str(v) for v in value)
    return str(value)


def as_json(value: Value):
    """JSON-friendly form (tuples become lists)."""
    return list(value) if isinstance(value, tuple) else value


def _is_int(text: str) -> bool:
    try:
        int(text)
        return True
    except ValueError:
        return False

"""Line numbers for TOML keys, which tomllib does not keep.

Each line that opens a table or assigns a key is parsed on its own with
tomllib, which yields its full dotted path with TOML's own quoting rules;
so `[sysctl."net.core.somaxconn"]` and `at_least = 4096` below it locate
("sysctl", "net.core.somaxconn", "at_least") exactly.
"""

import re
import tomllib

HEADER = re.compile(r"^\s*\[[^\[]")


def _path_of(fragment: str) -> tuple:
    try:
        doc = tomllib.loads(fragment)
    except tomllib.TOMLDecodeError:
        return ()
    path = []
    while isinstance(doc, dict) and len(doc) == 1:
        key, doc = next(iter(doc.items()))
        path.append(key)
    return tuple(path)


def index(text: str) -> dict[tuple, int]:
    """Every table and key path in the document -> its 1-based line."""
    where: dict[tuple, int] = {}
    table: tuple = ()
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if HEADER.match(line):
            table = _path_of(stripped)
            where.setdefault(table, n)
        elif "=" in stripped:
            key = _path_of(stripped.split("=", 1)[0] + "= 0")
            if key:
                where.setdefault(table + key, n)
    return where


def line_of(where: dict[tuple, int], path: tuple) -> int | None:
    """Line of `path`, else of the first thing inside it, else of its deepest known prefix."""
    if path in where:
        return where[path]
    inside = [line for p, line in where.items() if p[:len(path)] == path]
    if inside:
        return min(inside)
    for end in range(len(path) - 1, 0, -1):
        if path[:end] in where:
            return where[path[:end]]
    return None

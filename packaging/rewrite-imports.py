#!/usr/bin/env python3
"""Rewrite the checkout's absolute imports to the one installed namespace.

`from tune.errors import X` becomes `from proxytune.tune.errors import X`
(likewise core, proxies, probes, microbench, reports, commands, cli), and module paths given as
strings to monkeypatch/mock.patch/import_module follow. Relative imports are left alone.
Deterministic and idempotent: run it again after merging branches that add
old-style imports; `--check` lists what it would change and exits 1.

    python3 packaging/rewrite-imports.py [--check] [REPO]
"""

import re
import sys
from pathlib import Path

PACKAGES = ("core", "proxies", "tune", "probes", "microbench", "reports", "commands", "cli")
NAMES = "|".join(PACKAGES)
FROM = re.compile(rf"^(\s*)from ({NAMES})((?:\.\w+)*) import ", re.M)
IMPORT_AS = re.compile(rf"^(\s*)import ({NAMES})\.((?:\w+\.)*)(\w+) as (\w+)\s*$", re.M)
IMPORT_BARE = re.compile(rf"^(\s*)import ({NAMES})\s*$", re.M)
IMPORT_DOTTED = re.compile(rf"^\s*import ({NAMES})\.[\w.]+\s*$", re.M)
STRING = re.compile(rf"""((?:setattr|delattr|patch|import_module)\(\s*)(["'])({NAMES})\.(\w+)""")
SOURCES = ("cli.py", "commands", "core", "proxies", "tune", "probes", "microbench", "reports", "tests", "packaging")


def python_files(repo: Path) -> list[Path]:
    out = []
    for name in SOURCES:
        path = repo / name
        out += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return [p for p in out if p.is_file() and p.resolve() != Path(__file__).resolve()]


def is_module(repo: Path, package: str, name: str) -> bool:
    return package != "cli" and ((repo / package / f"{name}.py").is_file() or (repo / package / name).is_dir())


def rewrite(text: str, repo: Path) -> str:
    text = FROM.sub(lambda m: f"{m[1]}from proxytune.{m[2]}{m[3]} import ", text)
    text = IMPORT_AS.sub(lambda m: f"{m[1]}from proxytune.{m[2]}{('.' + m[3].rstrip('.')) if m[3] else ''} "
                                   f"import {m[4]} as {m[5]}", text)
    text = IMPORT_BARE.sub(lambda m: f"{m[1]}from proxytune import {m[2]}", text)
    return STRING.sub(lambda m: f"{m[1]}{m[2]}proxytune.{m[3]}.{m[4]}" if is_module(repo, m[3], m[4]) else m[0], text)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    repo = Path(args[0] if args else Path(__file__).resolve().parent.parent)
    changed, unsupported = [], []
    for path in python_files(repo):
        old = path.read_text()
        unsupported += [f"{path}: {m[0].strip()}" for m in IMPORT_DOTTED.finditer(old)]
        new = rewrite(old, repo)
        if new != old:
            changed.append(path)
            if not check:
                path.write_text(new)
    for line in unsupported:
        print(f"rewrite-imports: cannot rewrite (use `from X import Y`): {line}", file=sys.stderr)
    for path in changed:
        print(f"{'would rewrite' if check else 'rewrote'} {path.relative_to(repo)}")
    return 1 if unsupported or (check and changed) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Where profile files come from, and how one is read, when root may be the reader.

A profile NAME (linux/proxy, site/edge) is looked up only in the catalogs: the
site's /etc/proxytune/profiles (under --root), the user's
$XDG_CONFIG_HOME/proxytune/profiles, then the shipped ones; `shipped:NAME`
names the shipped one even where a site profile hides it (so the site's
linux/proxy can include the shipped linux/proxy). Never the current
directory: a `./linux/proxy` another user left where root happens to stand
must not become root's profile.

A PATH is a reference that says it is one: it starts with `/`, `./` or `../`,
or ends in `.toml`. It is read only when it passes the catalog files' trust
check (untrusted()); so is every file load() opens, each include too. Every
file is read as a regular file of bounded size (a FIFO must not hang root).
"""

import os
import stat
from pathlib import Path

from proxytune.core.errors import ProfileError

from . import names
from .datafiles import shipped

PROFILES_DIR = shipped("profiles")
SHIPPED = "shipped:"
MAX_BYTES = 1 << 20          # the largest shipped profile is a few KiB


def is_path(ref: str) -> bool:
    """A file reference rather than a catalog name (the rule `--profile` help states)."""
    return ref.startswith(("/", "./", "../")) or ref.endswith(".toml")


def search_dirs(root: Path | None = None) -> list[tuple[str, Path, str | None]]:
    """(source, directory, why it is ignored or None), first match wins. A directory
    others can write is ignored: root must not apply a profile another user planted."""
    config = os.environ.get("XDG_CONFIG_HOME", "")
    if not config.startswith("/"):      # the XDG spec: a relative one is invalid (it would be the cwd)
        config = str(Path.home() / ".config")
    dirs = [("site", Path(root or "/") / "etc/proxytune/profiles"),
            ("user", Path(config) / "proxytune/profiles")]
    out = [(source, d, untrusted(d)) for source, d in dirs if d.is_dir()]
    return out + [("shipped", PROFILES_DIR, None)]


def untrusted(path: Path) -> str | None:
    """Why not to read this file or directory: it, or a directory above it (symlinks
    followed), belongs to another user or others can write it (sticky /tmp aside).
    The shipped catalog is the program's own data, trusted as its code is."""
    real = path.resolve()
    if real.is_relative_to(PROFILES_DIR.resolve()):
        return None
    for d in (real, *real.parents):
        try:
            st = os.stat(d)
        except OSError as e:
            return f"cannot stat {d}: {e.strerror}"
        if st.st_uid not in (0, os.geteuid()):
            return f"{d} belongs to uid {st.st_uid}"
        if st.st_mode & 0o022 and not (d != real and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
            return f"{d} is writable by others"
    return None


def scan(root: Path | None) -> tuple[dict[str, tuple[str, Path]], list[str]]:
    """(name -> (source, file), why each skipped file or directory was ignored)."""
    found: dict[str, tuple[str, Path]] = {}
    ignored = []
    for source, d, problem in search_dirs(root):
        if problem:
            ignored.append(f"ignored {d}: {problem}")
            continue
        for p in sorted(d.rglob("*.toml")):
            if why := untrusted(p):
                ignored.append(f"ignored {p}: {why}")
            else:
                found.setdefault(str(p.relative_to(d).with_suffix("")), (source, p))
    return dict(sorted(found.items())), ignored


def locate(ref: str, including: Path | None = None, root: Path | None = None) -> Path:
    """The file a reference means: a catalog name, `shipped:NAME`, or a trusted path
    (relative to the including file's directory for an include, else to the cwd)."""
    try:                # the reference is printed in export headers and the playbook's play name:
        names.no_control(ref, "profile reference")      # one line there, and never live Jinja
        names.inert(ref, "profile reference")
    except ValueError as e:
        raise ProfileError(names.shown(ref), None, None, str(e))
    if ref.startswith(SHIPPED):
        name = ref[len(SHIPPED):]
        path = (PROFILES_DIR / f"{name}.toml").resolve()      # an absolute NAME would replace the base
        if not path.is_relative_to(PROFILES_DIR.resolve()) or ".." in Path(name).parts or not path.is_file():
            raise ProfileError(ref, None, None, f"no such shipped profile {name!r}")
        return path
    if is_path(ref):
        path = (including.parent if including and not ref.startswith("/") else Path()) / ref
        if not path.exists():
            raise ProfileError(ref, None, None, "no such file")
        if why := untrusted(path):
            raise ProfileError(ref, None, None, f"refused: {why}")
        return path.resolve()
    known = scan(root)[0]
    if ref in known:
        return known[ref][1].resolve()
    raise ProfileError(ref, None, None, f"no such profile (known: {', '.join(known)}; "
                                        "a file is ./NAME.toml or a path ending in .toml)")


def read(path: Path) -> str:
    """The file's text: vetted again as it is opened, a regular file, at most MAX_BYTES."""
    if why := untrusted(path):
        raise ProfileError(path, None, None, f"refused: {why}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise ProfileError(path, None, None, f"cannot read: {e.strerror}")
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProfileError(path, None, None, "not a regular file")
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ProfileError(path, None, None, f"larger than {MAX_BYTES} bytes; not a profile")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ProfileError(path, None, None, "not UTF-8 text")

"""Profiles: TOML files in profiles/, loaded, included, validated, expanded.

A profile looks like

    [profile]
    description = "A busy proxy host"
    os = "linux"
    include = ["linux/base"]          # optional; later files override (names and paths
                                      # as profilefiles.py finds and vets them)

    [params]                          # optional; the command line overrides
    service = "squid"

    [sysctl."net.core.somaxconn"]
    at_least = 4096                   # or value / at_most / covers
    reason = "accept queue for bursts of new connections"
    source = "Documentation/networking/ip-sysctl.rst"
    waive = "CHG-1: why not here"     # optional: check shows it `waived`, apply leaves it

Keys may use {service}, {user} and {cache_dir} (one setting per cache
directory). Every problem is reported as `file:line: key: problem`, before
anything on the host is looked at or changed.
"""

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from . import backends, names, profilefiles, tomlpos
from proxytune.core.errors import ProfileError
from .model import Setting
from .modes import MODES
from .params import PARAMS
from .values import parse

PROFILES_DIR = profilefiles.PROFILES_DIR
PROFILE_KEYS = {"description": str, "os": str, "include": list}
SETTING_TEXT = ("reason", "source")
OPTIONAL_TEXT = ("waive",)            # waive = "why": check reports it `waived`, apply leaves it alone
PLACEHOLDERS = ("{service}", "{user}", "{cache_dir}")


@dataclass
class RawSetting:
    """A setting as written, before parameters are filled in."""
    backend: str
    key: str
    mode: str
    wanted: object
    reason: str
    source: str
    path: Path
    line: int | None
    waive: str = ""
    critical: bool = False      # drift of it is CRITICAL, not WARNING, for monitoring (--format nagios)


@dataclass
class Profile:
    name: str
    path: Path
    os: str
    description: str
    params: dict
    raw: list[RawSetting] = field(default_factory=list)


def catalog(root: Path | None = None) -> dict[str, tuple[str, Path]]:
    """Every profile name -> (source, file); a site or user profile hides a shipped one of that name."""
    return profilefiles.scan(root)[0]


def ignored(root: Path | None = None) -> list[str]:
    """Site or user profiles (or their directories) skipped as untrusted, and why."""
    return profilefiles.scan(root)[1]


def available(root: Path | None = None) -> list[str]:
    return list(catalog(root))


def listing(root: Path | None = None) -> tuple[list[dict], list[str]]:
    """(one row per usable profile, warnings): a broken or untrusted one is skipped and
    named, so one bad site file does not hide every other profile."""
    rows, warnings = [], ignored(root)
    for name, (source, path) in catalog(root).items():
        try:
            p = load(name, root=root)
        except ProfileError as e:
            warnings.append(f"skipped {name} ({source}): {e.message}")
            continue
        rows.append({"name": name, "source": source, "path": str(path), "os": p.os, "settings": len(p.raw),
                     "description": p.description})
    return rows, warnings


def shown(name: str, p: Profile) -> dict:
    """`profiles show --json`: the profile and every setting of it (includes resolved)."""
    rows = [{"setting": f"{r.backend}:{r.key}", "mode": r.mode, "wanted": r.wanted, "reason": r.reason,
             "source": r.source} for r in p.raw]
    return {"name": name, "os": p.os, "description": p.description, "params": p.params, "settings": rows}


def load(ref: str, _stack: tuple = (), root: Path | None = None) -> Profile:
    """The profile a name or path means, with its includes merged in (later ones win)."""
    path = profilefiles.locate(ref, None, root)
    text = profilefiles.read(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = getattr(e, "lineno", None) or _line_from_message(str(e)) or 1
        raise ProfileError(path, line, None, f"TOML syntax error: {str(e).split(' (at')[0]}")
    where = tomlpos.index(text)

    def fail(keypath: tuple, problem: str, label: str | None = None):
        line = tomlpos.line_of(where, keypath) or 1
        raise ProfileError(path, line, label or ".".join(keypath), problem)   # made one line there

    head, os_name, params = _check_head(doc, fail)
    merged_params, settings = _includes(head.get("include", []), path, os_name, _stack, root, fail)
    merged_params.update(params)

    kinds = backends.kinds(os_name)
    for kind, table in doc.items():
        if kind in ("profile", "params"):
            continue
        if kind not in kinds:
            fail((kind,), f"unknown backend for {os_name} (known: {', '.join(kinds)})")
        if not isinstance(table, dict):
            fail((kind,), "expected a table of settings")
        for key, spec in table.items():
            address = f"{kind}:{key}"
            if not isinstance(spec, dict):
                fail((kind, key), "expected a table with a mode, reason and source", address)
            raw = _raw_setting(kind, key, spec, path, where, fail)
            settings[address] = raw
    return Profile(name=ref, path=path, os=os_name, description=head.get("description", ""),
                   params=merged_params, raw=list(settings.values()))


def _includes(refs: list, path: Path, os_name: str, stack: tuple, root, fail) -> tuple[dict, dict]:
    """(params, settings by address) of the included profiles, each located and vetted like the first."""
    merged_params: dict = {}
    settings: dict[str, RawSetting] = {}
    for inc in refs:
        if not isinstance(inc, str):
            fail(("profile", "include"), "include takes a list of profile names")
        _checked(names.inert, (inc, "include"), ("profile", "include"), fail)
        try:
            child = profilefiles.locate(inc, path, root)
        except ProfileError as e:
            fail(("profile", "include"), f"{inc}: {e.problem}")
        if child in stack + (path,):
            chain = " -> ".join(p.name for p in stack + (path, child))
            fail(("profile", "include"), f"include loop: {chain} (to extend the shipped profile "
                                         f"of the same name, include \"{profilefiles.SHIPPED}NAME\")")
        parent = load(str(child), stack + (path,), root)
        if parent.os != os_name:
            fail(("profile", "include"), f"includes {inc} for {parent.os}, but this profile is for {os_name}")
        merged_params.update(parent.params)
        settings.update({f"{r.backend}:{r.key}": r for r in parent.raw})
    return merged_params, settings


def _check_head(doc: dict, fail) -> tuple[dict, str, dict]:
    """The [profile] and [params] tables, every key known, typed and its value checked."""
    head = doc.get("profile")
    if not isinstance(head, dict):
        fail(("profile",), "missing [profile] table (with os = \"linux\" or \"freebsd\")")
    _check_table(head, "profile", PROFILE_KEYS, "unknown key",
                 lambda k, v: names.text(v, k) if k == "description" else v, fail)
    os_name = head.get("os")
    if os_name not in backends.OSES:
        fail(("profile", "os"), f"os must be one of {', '.join(backends.OSES)}, got {os_name!r}")
    params = doc.get("params", {})
    if not isinstance(params, dict):
        fail(("params",), "expected a table")
    _check_table(params, "params", PARAMS, "unknown parameter", names.param, fail)
    return head, os_name, params


def _check_table(table: dict, section: str, known: dict, unknown: str, check, fail) -> None:
    """Every key of the table known and of its type, and its value passing `check`."""
    for k, v in table.items():
        if k not in known:
            fail((section, k), f"{unknown} (known: {', '.join(known)})")
        if not isinstance(v, known[k]):
            fail((section, k), f"expected {known[k].__name__}, got {type(v).__name__}")
        _checked(names.inert, (v, k), (section, k), fail)
        _checked(check, (k, v), (section, k), fail)


def _checked(check, args: tuple, keypath: tuple, fail, label: str | None = None):
    """Run a names.* check; its ValueError becomes the profile's `file:line: key: problem`."""
    try:
        return check(*args)
    except ValueError as e:
        fail(keypath, str(e), label)


def _raw_setting(kind, key, spec, path, where, fail) -> RawSetting:
    address = f"{kind}:{key}"
    _checked(names.text, (key, "setting name", 4096), (kind, key), fail, address)
    given = [m for m in MODES if m in spec]
    fields = MODES + SETTING_TEXT + OPTIONAL_TEXT + ("critical",)
    for k in spec:
        if k not in fields:
            fail((kind, key, k), f"unknown field {k!r} (known: {', '.join(fields)})", address)
    if not isinstance(spec.get("critical", False), bool):
        fail((kind, key, "critical"), "critical is true or false", address)
    if len(given) != 1:
        fail((kind, key), f"needs exactly one of {', '.join(MODES)}, got {len(given)}", address)
    for k in SETTING_TEXT:
        if not isinstance(spec.get(k), str) or not spec[k].strip():
            fail((kind, key, k) if k in spec else (kind, key), f"needs a non-empty text field {k!r}", address)
        _checked(names.text, (spec[k], k), (kind, key, k), fail, address)
    for k in OPTIONAL_TEXT:
        if k in spec and (not isinstance(spec[k], str) or not spec[k].strip()):
            fail((kind, key, k), f"{k} takes a non-empty text: why this setting is left as it is", address)
        if k in spec:
            _checked(names.text, (spec[k], k), (kind, key, k), fail, address)
    mode = given[0]
    raw_value = spec[mode]
    try:
        for item in raw_value if isinstance(raw_value, list) else [raw_value]:
            if isinstance(item, str):       # before parse(): "1\n2" must not pass as a range
                names.value(item)
        wanted = names.value(parse(raw_value))
    except ValueError as e:
        fail((kind, key, mode), str(e), address)
    if mode == "covers" and not (isinstance(wanted, tuple) and len(wanted) == 2):
        fail((kind, key, mode), "covers takes a range of two numbers", address)
    for ph in ("{", "}"):
        stripped = key
        for known in PLACEHOLDERS:
            stripped = stripped.replace(known, "")
        if ph in stripped:
            fail((kind, key), f"unknown placeholder (known: {', '.join(PLACEHOLDERS)})", address)
    return RawSetting(kind, key, mode, wanted, spec["reason"], spec["source"], path,
                      tomlpos.line_of(where, (kind, key, mode)), spec.get("waive", ""), spec.get("critical", False))


def _line_from_message(msg: str) -> int | None:
    import re
    m = re.search(r"line (\d+)", msg)
    return int(m.group(1)) if m else None


def expand(profile: Profile, params: dict, host) -> tuple[list[Setting], list[str]]:
    """Fill in parameters and validate every setting against its backend."""
    out, notes = [], []
    for raw in profile.raw:
        keys = [raw.key]
        if "{cache_dir}" in raw.key:
            keys = [raw.key.replace("{cache_dir}", d) for d in params["cache_dirs"]]
            if not keys:
                notes.append(f"{raw.backend}:{raw.key} skipped: no cache directories "
                             f"(none found for {params['service']}; pass --cache-dir)")
        for key in keys:
            key = key.replace("{service}", params["service"]).replace("{user}", params["user"])
            s = Setting(raw.backend, key, raw.mode, raw.wanted, raw.reason, raw.source,
                        str(raw.path), raw.line, raw.waive, raw.critical)
            try:
                backends.get(profile.os, raw.backend, host).validate(s)
                _check_names(s)
            except ValueError as e:
                raise ProfileError(raw.path, raw.line, s.address, str(e))
            out.append(s)
    _check_across(profile, out)
    return out, notes


def _check_names(s: Setting) -> None:
    """The same rules for every backend, whoever wrote it: the owner of an
    OWNER:LIMIT key (service, limits domain, login class) and a sane maximum
    for every resource limit."""
    owner, _, limit = s.key.rpartition(":")
    if s.backend in names.OWNERS:
        names.OWNERS[s.backend](owner)
    if limit in names.LIMIT_MAX or limit in names.DIRECTIVE_LIMIT:
        names.limit_value(limit, s.wanted)


def _check_across(profile: Profile, settings: list[Setting]) -> None:
    """Rules that involve two settings or the host: fd limits vs fs.nr_open, port ranges."""
    by_address = {s.address: s for s in settings}
    if profile.os == "linux":
        nr_open = by_address.get("sysctl:fs.nr_open")
        ceiling = nr_open.wanted if nr_open else _host_nr_open()
        for s in settings:
            if s.key.endswith(("nofile", "LimitNOFILE")) and isinstance(s.wanted, int) and ceiling and s.wanted > ceiling:
                raise ProfileError(s.file, s.line, s.address,
                                   f"{s.wanted} exceeds fs.nr_open ({ceiling}); "
                                   "the kernel refuses fd limits above it: raise sysctl fs.nr_open too")
    if profile.os == "freebsd":
        first = by_address.get("sysctl:net.inet.ip.portrange.first")
        last = by_address.get("sysctl:net.inet.ip.portrange.last")
        if first and last and first.wanted > last.wanted:
            raise ProfileError(first.file, first.line, first.address,
                               f"inverted port range: first {first.wanted} > last {last.wanted}")


def _host_nr_open() -> int | None:
    try:
        return int(Path("/proc/sys/fs/nr_open").read_text())
    except (OSError, ValueError):
        return None

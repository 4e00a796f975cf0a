"""Validators for every name and value that can reach a file or a command.

One place, so that a profile, a command-line option and every backend agree
on what a service, user, limits domain, login class, sysctl or cache
directory may look like. Each check matches the whole text (re.fullmatch:
`re.match(...$)` lets a trailing newline through), refuses control
characters (< 0x20, 0x7f-0x9f, Unicode line separators and bidi overrides)
and bounds the length; character classes are
ASCII only, so a Unicode look-alike is not a name. Each raises ValueError
with the problem in one line (the offending text shown with repr, so a
newline in it cannot start a second line).
"""

import re

from proxytune.core.errors import CONTROL
MAX_TEXT = 1000          # reason, source, description
MAX_VALUE = 4096         # a sysctl string: the kernel takes at most a page
MAX_PATH = 4096          # PATH_MAX

# The most a limit may be set to. nofile: the kernel's ceiling for fs.nr_open
# (the profile check also holds it under the host's fs.nr_open); nproc: the
# kernel's PID_MAX_LIMIT, since no more tasks can exist; memlock/core: 1 TiB
# (bytes; KiB in limits.conf, still far beyond any proxy's need).
LIMIT_MAX = {"nofile": 2147483584, "nproc": 4194304, "memlock": 2**40, "core": 2**40}
DIRECTIVE_LIMIT = {"LimitNOFILE": "nofile", "LimitNPROC": "nproc", "LimitMEMLOCK": "memlock",
                   "LimitCORE": "core", "openfiles": "nofile"}

_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"           # POSIX portable, no leading '-'
SERVICE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(@[A-Za-z0-9_.-]*)?")
USER = re.compile(_NAME)
COMM = re.compile(r"[A-Za-z0-9_\[][A-Za-z0-9_.@:+\[\]-]*")      # a process name, e.g. squid or [TS_MAIN]
DOMAIN = re.compile(rf"\*|[@%]?{_NAME}|[0-9]+:[0-9]*|:[0-9]+|@[0-9]+:[0-9]*|@:[0-9]+|%:[0-9]+")
LOGIN_CLASS = re.compile(_NAME)
LINUX_SYSCTL = re.compile(r"[a-z0-9_][a-z0-9_-]*(\.[A-Za-z0-9_-]+)+")
FREEBSD_SYSCTL = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)+")


def shown(text: str, limit: int = 60) -> str:
    """The text quoted and cut short, non-ASCII escaped: one line, and a look-alike shows as \\u0455."""
    return ascii(text) if len(text) <= limit else ascii(text[:limit]) + "..."


def no_control(text: str, what: str) -> str:
    """The text, if free of control characters (newline, tab, NUL, DEL, ...)."""
    m = CONTROL.search(text)
    if m:
        raise ValueError(f"{what} {shown(text)} contains the control character {ascii(m.group())}")
    return text


def _name(text, pattern: re.Pattern, what: str, rule: str, limit: int) -> str:
    if not isinstance(text, str):
        raise ValueError(f"{what} must be text, not {type(text).__name__}")
    no_control(text, what)
    if not text:
        raise ValueError(f"{what} is empty")
    if len(text) > limit:
        raise ValueError(f"{what} {shown(text)} is longer than {limit} characters")
    if not pattern.fullmatch(text):
        raise ValueError(f"not a {what}: {shown(text)} ({rule})")
    return text


def service(name) -> str:
    """A systemd unit name without `.service` (also the proxy's process name)."""
    return _name(name, SERVICE, "service name", "letters, digits, '_', '.', '-', one '@'; "
                 "not starting with '-' or '.'", 200)


def process_name(name) -> str:
    """A process name as /proc/PID/comm shows it (matched on its first 15 characters); never reaches a shell."""
    return _name(name, COMM, "process name", "letters, digits and _ . @ : + - [ ]; not starting with '-' or '.'", 64)


def user(name) -> str:
    return _name(name, USER, "user name", "POSIX portable: letters, digits, '_', '.', '-'; "
                 "not starting with '-'", 32)


def limits_domain(name) -> str:
    return _name(name, DOMAIN, "limits.conf domain", "a user, @group, %group, '*' or a uid range MIN:MAX", 64)


def login_class(name) -> str:
    return _name(name, LOGIN_CLASS, "login class", "letters, digits, '_', '.', '-'", 64)


def linux_sysctl(name) -> str:
    return _name(name, LINUX_SYSCTL, "sysctl name", "dotted, e.g. net.core.somaxconn", 255)


def freebsd_sysctl(name) -> str:
    return _name(name, FREEBSD_SYSCTL, "FreeBSD sysctl name", "dotted lower case, e.g. kern.ipc.somaxconn", 255)


def directory(path, what: str = "cache directory") -> str:
    """An absolute path with no '.'/'..' part, no braces, no control characters."""
    if not isinstance(path, str):
        raise ValueError(f"{what} must be text, not {type(path).__name__}")
    no_control(path, what)
    if len(path) > MAX_PATH:
        raise ValueError(f"{what} {shown(path)} is longer than {MAX_PATH} characters")
    if not path.startswith("/"):
        raise ValueError(f"{what} {shown(path)} is not an absolute path")
    if any(part in (".", "..") for part in path.split("/")):
        raise ValueError(f"{what} {shown(path)} has a '.' or '..' part; give the real path")
    if "{" in path or "}" in path:
        raise ValueError(f"{what} {shown(path)} contains a brace")
    if path != path.strip():
        raise ValueError(f"{what} {shown(path)} begins or ends with a space")
    return path


# What an export's consumer would evaluate rather than copy: Jinja (Ansible templates
# task names, module arguments and `when:`) and tuned's ${...} expansion (${f:exec:...}
# runs a command as root when the daemon loads the profile).
EVALUATED = ("{{", "{%", "{#", "${")


def inert(value, what: str):
    """The text, if no export's consumer would evaluate any part of it."""
    for item in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(item, str) and (found := next((m for m in EVALUATED if m in item), None)):
            raise ValueError(f"{what} {shown(item)} contains {found!r}, which Ansible or tuned would "
                             "evaluate as code in an export; write it without")
    return value


def text(value, what: str, limit: int = MAX_TEXT) -> str:
    """Free text that may end up in a comment or a task name: one line, bounded, inert."""
    no_control(value, what)
    inert(value, what)
    if len(value) > limit:
        raise ValueError(f"{what} is longer than {limit} characters")
    return value


def limit_value(limit: str, value) -> int:
    """A resource limit: an integer from 1 to the limit's maximum."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    top = LIMIT_MAX.get(DIRECTIVE_LIMIT.get(limit, limit), LIMIT_MAX["memlock"])
    if not 1 <= value <= top:
        raise ValueError(f"{value} is out of range 1..{top} for {limit}")
    return value


def value(v, what: str = "value"):
    """A setting's wanted value: text bounded and free of control characters, numbers within 64 bits."""
    for item in v if isinstance(v, tuple) else (v,):
        if isinstance(item, str):
            text(item, what, MAX_VALUE)
        elif isinstance(item, int) and not isinstance(item, bool) and not -2**63 <= item < 2**64:
            raise ValueError(f"{item} does not fit in 64 bits")
    return v


PARAM_CHECKS = {"service": service, "user": user}
OWNERS = {"rlimit": process_name, "service": service, "limits": limits_domain, "login": login_class}


def param(name: str, v) -> object:
    """A profile parameter (service, user, cache_dirs) checked by its own rule."""
    if name == "cache_dirs":
        if not isinstance(v, (list, tuple)):
            raise ValueError("expected a list of directories")
        return [directory(d) for d in v]
    return PARAM_CHECKS[name](v)

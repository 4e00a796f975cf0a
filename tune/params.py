"""Profile parameters: the proxy service, its user and its cache directories.

Precedence: the command line, then the profile's [params], then what this
host shows (a running proxy, an installed unit, the proxy's own config),
then a default. Every value says where it came from, so the audit can show it.
"""

import glob
import os
import pwd
from collections import Counter

from . import hostfiles, names
from proxytune.core import procfs, proxytree
from proxytune.core.errors import ProxytuneError
from .host import Host
from proxytune import proxies
from proxytune.proxies.base import Line

# the registry's order (proxies/): the first running one is audited
KNOWN_PROXIES = tuple(exe for k in proxies.KINDS for exe in k.exe_names)
# the user each one's service runs as (varnishd's master runs as varnish, its cache child as vcache)
DEFAULT_USERS = {exe: k.service_user or k.user for k in proxies.KINDS for exe in k.exe_names}
PARAMS = {"service": str, "user": str, "cache_dirs": list}
OPTIONS = {"service": "--service", "user": "--user", "cache_dirs": "--cache-dir"}


def resolve(host: Host, cli: dict, profile: dict, notes: list | None = None) -> tuple[dict, dict]:
    """(values, sources) for every parameter; what detection ignored, and why, goes to `notes`."""
    values, sources = {}, {}
    notes = [] if notes is None else notes

    def pick(name, detect):
        if cli.get(name) not in (None, [], ()):      # an empty --service '' is checked, not ignored
            values[name], sources[name] = cli[name], "command line"
        elif profile.get(name):
            values[name], sources[name] = profile[name], "profile"
        else:
            values[name], sources[name] = detect()

    pick("service", lambda: detect_service(host, notes))
    pick("user", lambda: detect_user(host, values["service"], notes))
    pick("cache_dirs", lambda: detect_cache_dirs(host, values["service"]))
    values["cache_dirs"] = list(dict.fromkeys(values["cache_dirs"]))     # a directory named twice is one
    for name in PARAMS:
        check(name, values[name], sources[name])
    return values, sources


def check(name: str, value, source: str) -> None:
    """Refuse a hostile or malformed parameter, naming where it came from
    (`--service: ...` for an option), before it reaches any backend or export."""
    try:
        names.param(name, value)
    except ValueError as e:
        problem = str(e)
        if source == "command line":
            raise ProxytuneError(f"{OPTIONS[name]}: {problem}", "nothing was changed")
        raise ProxytuneError(f"{name} from {source}: {problem}",
                             f"pass {OPTIONS[name]} to override; nothing was changed")


ALSO_RUNNING = "; also running: "


def detect_service(host: Host, notes: list) -> tuple[str, str]:
    """The first proxy in KNOWN_PROXIES' fixed order (not whichever started last) whose service runs
    (core.proxytree: a name alone is nobody's proof), the others that run named in its source; else
    an installed unit; else squid. Under --root no live process is read: they are not that root's."""
    running = []
    if host.live:
        procs, units = proxytree.Processes(), proxytree.Units()
        for kind in proxies.KINDS:
            choice = proxytree.find(proxies.identity(kind), procs, units)
            if choice.tree:
                running.append((kind.exe_names[0], choice.tree))
            notes += [choice.note()] if choice.note() else []
    if running:
        (name, tree), others = running[0], [n for n, _ in running[1:]]
        return name, f"running process ({tree.shown()})" + (ALSO_RUNNING + ", ".join(others) if others else "")
    for name in KNOWN_PROXIES:
        for d in ("/lib/systemd/system", "/usr/lib/systemd/system", "/etc/systemd/system"):
            if host.path(f"{d}/{name}.service").exists():
                return name, "installed unit"
    return "squid", "default"


def choice_notes(values: dict, sources: dict) -> list[str]:
    """One line when several proxies run: which one this audits, which it leaves out, how to pick."""
    chosen, _, others = sources["service"].partition(ALSO_RUNNING)
    if not others:
        return []
    return [f"several proxies run: auditing {values['service']} (the first of {', '.join(KNOWN_PROXIES)} "
            f"that runs), not {others}; pass --service NAME to audit another"]


def detect_user(host: Host, service: str, notes: list) -> tuple[str, str]:
    """The system user the service's processes run as (never root, never a user's account: see
    core.proxytree); else the registry's default for the proxy. Under --root, the default."""
    default = DEFAULT_USERS.get(service, service)
    if not host.live:
        return default, "default (--root: running processes are not read)"
    choice = proxytree.find(proxies.identity_for(service))
    uids = Counter(u[0] for p in choice.pids if (u := procfs.uids_of(p)) and u[0] != 0)
    if not uids:
        return default, "default"
    uid = uids.most_common(1)[0][0]
    name = _user_name(uid)
    if not proxytree.is_system_uid(uid):
        top = proxytree.sys_uid_max()
        notes.append(f"{service}'s processes run as {name} (uid {uid}), not a system user (uid 1-{top}, "
                     f"SYS_UID_MAX of /etc/login.defs): not taken as {{user}}; pass --user to choose")
        return default, "default"
    return name, f"running process ({choice.tree.shown()})"


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def detect_cache_dirs(host: Host, service: str) -> tuple[list[str], str]:
    """The cache directories the proxy's config files on this host name (its module's host_configs and
    cache_dirs_in, proxies/), with the first file that names one as their source."""
    spec = proxies.for_service(service)
    if spec is None or not spec.host_configs:
        return [], "not detected for this service"
    dirs, unread, source = [], [], None
    for pattern in spec.host_configs:
        for f in sorted(glob.glob(os.path.join(glob.escape(str(host.root)), pattern.lstrip("/")))):
            text, why = _read_conf(f)
            shown = pattern if not glob.has_magic(pattern) else "/" + os.path.relpath(f, host.path("/"))
            found = spec.cache_dirs_in([Line(shown, n, s) for n, s in enumerate(text.splitlines(), 1)])
            source = source or (shown if found else None)
            dirs += found
            unread += [why] if why else []
    return dirs, source if dirs else (unread[0] if unread else "none configured")


def _read_conf(path) -> tuple[str, str]:
    """(text, why it could not be read): an unreadable proxy config leaves the cache dirs unknown."""
    try:
        return hostfiles.read(path) or "", ""
    except hostfiles.HostFileError as e:
        return "", e.message

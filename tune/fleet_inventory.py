"""Which hosts a fleet command reaches: Ansible resolves the inventory and
--limit; every name is then checked before it goes anywhere (a --limit
file, an extra-vars file, a result key). Names and patterns that could be
read as Jinja, a shell word or an option are refused, not escaped."""

import re
import shutil
import subprocess

from proxytune.core.errors import ProxytuneError

HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")
LIMIT = re.compile(r"[A-Za-z0-9_.:,!&*?~\[\]-]{1,1000}")
ARG = re.compile(r"[A-Za-z0-9_.:/*?,=@+\[\]-]{1,300}")


def check_host_name(name: str) -> str:
    if not HOST_NAME.fullmatch(name):
        raise ProxytuneError(f"inventory host name {name!r} is not a plain host name",
                             "use letters, digits, '.', '-', '_' and ':' (set ansible_host for the address)")
    return name


def check_arg(what: str, value: str) -> str:
    """A value passed on to proxytune on every host (profile, glob, id)."""
    if not ARG.fullmatch(value) or value.startswith("-"):
        raise ProxytuneError(f"{what} {value!r} has characters a fleet run does not pass on",
                             "use letters, digits and . _ / * ? - : (no spaces, braces or quotes)")
    return value


def ansible_binary(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise ProxytuneError(f"{name} is not installed", "apt-get install ansible-core (Debian) or pipx install ansible-core")
    return path


def hosts(inventory: str, limit: str | None, env: dict) -> list[str]:
    """The inventory's hosts after --limit, in inventory order, each validated."""
    if limit is not None and (not LIMIT.fullmatch(limit) or limit.startswith("-")):
        raise ProxytuneError(f"--limit {limit!r} is not an Ansible host pattern proxytune passes on",
                             "e.g. --limit 'proxies:!canary' or --limit 'web*'")
    argv = [ansible_binary("ansible"), "all", "-i", inventory, "--list-hosts"]
    if limit:
        argv += ["--limit", limit]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProxytuneError(f"ansible could not read the inventory {inventory}: {last}",
                             "check it with: ansible-inventory -i INVENTORY --graph")
    lines = r.stdout.splitlines()
    head = re.fullmatch(r"\s*hosts \((\d+)\):", lines[0]) if lines else None
    names = [line.strip() for line in lines[1:] if line.strip()]
    if not head or int(head.group(1)) != len(names):
        raise ProxytuneError(f"cannot tell the hosts of {inventory} apart (a name with a line break?)")
    if not names:
        raise ProxytuneError(f"no host in {inventory} matches {limit or 'all'}")
    return [check_host_name(n) for n in names]

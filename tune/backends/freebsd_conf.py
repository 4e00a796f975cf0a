"""FreeBSD sysctls: live through sysctl(8), persistent in /etc/sysctl.conf;
boot-time tunables (`loader:`) in /boot/loader.conf.

Every live read and write goes through the host's command runner, so the
backends run unchanged on FreeBSD and are exercised on Linux by tests that
replace the runner.
"""

import re

from proxytune.core.errors import BackendError, NotApplicable
from proxytune.core.numbers import is_uint
from ..hostfiles import HostFileError, read as read_text
from ..names import freebsd_sysctl
from ..values import parse, render
from .base import Backend


def set_keys(text: str, values: dict[str, str], quote: bool = False) -> str:
    """Replace `key=value` lines in place (last one wins), append the rest."""
    lines = text.splitlines()
    pending = dict(values)
    for i, line in enumerate(lines):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*=", line)
        if m and m.group(1) in values:
            key = m.group(1)
            lines[i] = _line(key, values[key], quote)
            pending.pop(key, None)
    if pending:
        lines.append("# proxytune")
        lines += [_line(k, v, quote) for k, v in sorted(pending.items())]
    return "\n".join(lines) + "\n"


def get_key(text: str, key: str) -> str | None:
    found = find_key(text, key)
    return found and found[0]


def find_key(text: str, key: str) -> tuple[str, int] | None:
    """(value, line number) of the last `key=value` line."""
    found = None
    for number, line in enumerate(text.splitlines(), 1):
        m = re.match(rf"\s*{re.escape(key)}\s*=\s*\"?([^\"#]*)\"?", line)
        if m:
            found = m.group(1).strip(), number
    return found


def _line(key, value, quote):
    return f'{key}="{value}"' if quote else f"{key}={value}"


def _check(setting):
    freebsd_sysctl(setting.key)
    v = setting.wanted
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"expected an integer, got {v!r}")
    if not 0 <= v < 2**63:
        raise ValueError(f"{v} is out of range 0..{2**63 - 1}")
    if setting.key.startswith("net.inet.ip.portrange.") and not 1 <= v <= 65535:
        raise ValueError(f"port {v} is out of range 1..65535")


class FreeBSDSysctlBackend(Backend):
    kind = "sysctl"
    os = "freebsd"
    FILE = "/etc/sysctl.conf"
    writes = (FILE,)

    def validate(self, setting):
        super().validate(setting)
        _check(setting)

    def read(self, key):
        try:
            return parse(self.host.runner.run(["sysctl", "-n", key]))
        except BackendError as e:
            if "unknown oid" in e.message:
                raise NotApplicable("no such sysctl on this kernel")
            raise

    def write(self, key, value):
        self.host.runner.run(["sysctl", f"{key}={render(value)}"])

    def file_edits(self, changes):
        path = self.host.path(self.FILE)
        text = read_text(path) or ""
        return [(path, set_keys(text, {c.setting.key: render(c.target) for c in changes}))]


class FreeBSDLoaderBackend(Backend):
    """Boot-time tunables: the value configured in loader.conf, else the live one."""
    kind = "loader"
    os = "freebsd"
    runtime = False
    FILE = "/boot/loader.conf"
    writes = (FILE,)

    def validate(self, setting):
        super().validate(setting)
        _check(setting)

    def read(self, key):
        path = self.host.path(self.FILE)
        configured = find_key(read_text(path) or "", key)
        if configured is not None:
            value, number = configured
            if not is_uint(value):
                raise HostFileError(path, number, f"{key}={value!r} is not a number")
            return int(value)
        return FreeBSDSysctlBackend(self.host).read(key)

    def file_edits(self, changes):
        path = self.host.path(self.FILE)
        text = read_text(path) or ""
        return [(path, set_keys(text, {c.setting.key: render(c.target) for c in changes}, quote=True))]

    def after_files(self):
        return ["loader.conf tunables take effect at the next boot"]

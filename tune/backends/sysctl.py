"""Linux sysctls through /proc/sys; persisted in /etc/sysctl.d/90-proxytune.conf.

Network sysctls are per network namespace; one that the namespace lacks
(net.core.netdev_max_backlog outside the initial namespace) is reported as
not applicable rather than failing the plan.
"""

from pathlib import Path

from .. import modes, names, sysctld
from proxytune.core.errors import BackendError, NotApplicable
from ..hostfiles import HostFileError, read as read_host_file
from ..model import DRIFT, MET, Change
from ..values import parse, render
from .base import Backend

PERSIST_FILE = "/etc/sysctl.d/90-proxytune.conf"
INT_MAX = 2**31 - 1

# Documented kernel bounds for the knobs our profiles use (Documentation/
# admin-guide/sysctl and networking/ip-sysctl.rst). Others: non-negative.
BOUNDS = {
    "net.ipv4.tcp_tw_reuse": (0, 2),
    "net.ipv4.tcp_syncookies": (0, 2),
    "net.core.somaxconn": (1, INT_MAX),
    "net.ipv4.tcp_max_syn_backlog": (1, INT_MAX),
    "net.core.netdev_max_backlog": (1, INT_MAX),
    "net.ipv4.tcp_fin_timeout": (1, INT_MAX),
    "fs.nr_open": (64, 2147483584),
    "fs.file-max": (1, 2**63 - 1),
    "fs.aio-max-nr": (1, 2**63 - 1),
}
PORT_RANGES = {"net.ipv4.ip_local_port_range"}


class SysctlBackend(Backend):
    kind = "sysctl"
    writes = (PERSIST_FILE,)

    def _path(self, key: str) -> Path:
        return Path("/proc/sys") / key.replace(".", "/")

    def validate(self, setting):
        super().validate(setting)
        key, value = setting.key, setting.wanted
        names.linux_sysctl(key)
        names.value(value)
        if key in PORT_RANGES:
            check_port_range(value)
        elif key in BOUNDS:
            lo, hi = BOUNDS[key]
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"expected an integer, got {value!r}")
            if not lo <= value <= hi:
                raise ValueError(f"{value} is out of range {lo}..{hi}")
        elif isinstance(value, bool):
            raise ValueError(f"expected a number or a string, got {value!r}")
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, int) and v < 0:
                raise ValueError(f"negative value {v}")

    def read(self, key):
        try:
            return parse(self._path(key).read_text())
        except FileNotFoundError:
            raise NotApplicable("not on this kernel, or not in this network namespace")
        except PermissionError:
            raise BackendError(f"cannot read sysctl {key}: permission denied")

    def snapshot(self, key):
        try:
            return self._path(key).read_text().rstrip("\n")
        except FileNotFoundError:
            raise NotApplicable("not on this kernel, or not in this network namespace")

    def write(self, key, value):
        self._write_text(key, render(value, sep="\t"))

    def restore(self, key, snap):
        self._write_text(key, snap)

    def _write_text(self, key, text):
        try:
            self._path(key).write_text(text + "\n")
        except FileNotFoundError:
            raise NotApplicable("not on this kernel, or not in this network namespace")
        except OSError as e:
            raise BackendError(f"cannot write sysctl {key}={text!r}: {e.strerror}",
                               "run as root; some sysctls are read-only in containers")

    def at_boot(self, change):
        """Does a file the boot reads after ours set a value that fails this setting?"""
        s = change.setting
        lines = sysctld.lines_for(self.host, s.key)
        broken = [ln for ln in lines if ln.value is None]
        if broken:
            raise HostFileError(broken[-1].path, broken[-1].number,
                                f"not a `key = value` line, boot ignores it: {names.shown(broken[-1].text)}")
        ours = str(self.host.path(PERSIST_FILE))
        persisted = any(ln.path == ours for ln in lines)
        later = [ln for ln in lines if _after_ours(ln.path, ours)]
        if not later:
            return change
        last = later[-1]
        try:
            holds = modes.satisfied(s.mode, parse(last.value), s.wanted)
        except ValueError:
            raise HostFileError(last.path, last.number, f"{s.key} = {names.shown(last.value)} is not a value "
                                "the kernel takes for it")
        if holds:
            return change
        change.boot = f"overridden at boot by {last.where} ({s.key} = {last.value})"
        if persisted and change.status == MET:
            change.status, change.target = DRIFT, None
        return change

    def file_edits(self, changes):
        path = self.host.path(PERSIST_FILE)
        values = parse_conf(read_host_file(path) or "")
        values.update({c.setting.key: render(c.target) for c in changes})
        return [(path, render_conf(values))]


def _after_ours(path: str, ours: str) -> bool:
    """Is this boot file applied after our 90-proxytune.conf? (/etc/sysctl.conf comes last.)"""
    name = Path(path).name
    return path != ours and (path.endswith(sysctld.LEGACY) or name > Path(ours).name)


def check_port_range(value):
    if not (isinstance(value, tuple) and len(value) == 2):
        raise ValueError(f"expected two port numbers 'first last', got {value!r}")
    first, last = value
    if not (1 <= first <= 65535 and 1 <= last <= 65535):
        raise ValueError(f"ports must be within 1..65535, got {first} {last}")
    if first > last:
        raise ValueError(f"inverted port range: first {first} > last {last}")


def parse_conf(text: str) -> dict[str, str]:
    """key = value lines of a sysctl.conf-style file (comments dropped)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        k, v = line.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def render_conf(values: dict[str, str], header: str = "") -> str:
    head = header or "# Written by proxytune; `proxytune tune rollback` restores the previous file.\n"
    return head + "".join(f"{k} = {v}\n" for k, v in sorted(values.items()))

"""Backend registry: (os, kind) -> class. One module per kind of knob."""

from proxytune.core.errors import ProxytuneError
from .freebsd_conf import FreeBSDLoaderBackend, FreeBSDSysctlBackend
from .freebsd_login import FreeBSDLoginBackend
from .freebsd_mount import FreeBSDMountBackend
from .limits import LimitsBackend
from .mount import MountBackend
from .rlimit import RlimitBackend
from .sysctl import SysctlBackend
from .systemd import SystemdBackend

REGISTRY = {
    (cls.os, cls.kind): cls
    for cls in (SysctlBackend, RlimitBackend, SystemdBackend, LimitsBackend, MountBackend,
                FreeBSDSysctlBackend, FreeBSDLoaderBackend, FreeBSDLoginBackend, FreeBSDMountBackend)
}
OSES = sorted({os for os, _ in REGISTRY})


def kinds(os: str) -> list[str]:
    return sorted(kind for o, kind in REGISTRY if o == os)


def get(os: str, kind: str, host):
    try:
        return REGISTRY[(os, kind)](host)
    except KeyError:
        raise ProxytuneError(f"no backend {kind!r} for {os}", f"known: {', '.join(kinds(os))}")

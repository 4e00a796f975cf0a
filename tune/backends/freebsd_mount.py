"""FreeBSD mount options (`mount:PATH:noatime`): `mount -u` live, fstab persistent.

Mounts are listed with `mount -p` (fstab format) through the command runner.
FreeBSD has no relatime: a mount either updates atime or has noatime.
"""

from ..errors import NotApplicable
from ..files import read_text
from .. import fstab
from .base import Backend
from .mount import OPTIONS, split_key


class FreeBSDMountBackend(Backend):
    kind = "mount"
    os = "freebsd"
    modes = ("value",)

    def validate(self, setting):
        super().validate(setting)
        path, option = split_key(setting.key)
        if not path.startswith("/"):
            raise ValueError(f"expected an absolute path before ':{option}'")
        if option not in OPTIONS:
            raise ValueError(f"unknown mount option {option!r}; known: {', '.join(OPTIONS)}")
        if not isinstance(setting.wanted, bool):
            raise ValueError(f"expected true or false, got {setting.wanted!r}")

    def _mount(self, key):
        path, _ = split_key(key)
        best, opts = None, []
        for line in self.host.runner.run(["mount", "-p"]).splitlines():
            fields = line.split()
            if len(fields) < 4:
                continue
            mp = fstab.unescape(fields[1])
            if path == mp or path.startswith(mp.rstrip("/") + "/"):
                if best is None or len(mp) >= len(best):
                    best, opts = mp, fields[3].split(",")
        if best is None:
            raise NotApplicable(f"{path} is on no mount")
        return best, opts

    def read(self, key):
        return "noatime" in self._mount(key)[1]

    def snapshot(self, key):
        mp, opts = self._mount(key)
        return {"mountpoint": mp, "atime": "noatime" if "noatime" in opts else "atime"}

    def write(self, key, value):
        mp, _ = self._mount(key)
        self.host.runner.run(["mount", "-u", "-o", "noatime" if value else "atime", mp])

    def restore(self, key, snap):
        self.host.runner.run(["mount", "-u", "-o", snap["atime"], snap["mountpoint"]])

    def file_edits(self, changes):
        path = self.host.path("/etc/fstab")
        text = read_text(path)
        if text is None:
            return []
        new = text
        for c in changes:
            mp, _ = self._mount(c.setting.key)
            new = fstab.set_atime(new, mp, "noatime" if c.target else "atime") or new
        return [] if new == text else [(self.host.path("/etc/fstab.proxytune.bak"), text), (path, new)]

"""FreeBSD mount options (`mount:PATH:noatime`): `mount -u` live, fstab persistent.

Mounts are listed with `mount -p` (fstab format) through the command runner.
FreeBSD has no relatime: a mount either updates atime or has noatime.
"""

from proxytune.core.errors import NotApplicable
from .. import fstab
from .base import Backend
from .mount import check_setting, split_key


class FreeBSDMountBackend(Backend):
    kind = "mount"
    writes = ("/etc/fstab", "/etc/fstab.proxytune.bak")
    os = "freebsd"
    modes = ("value",)

    def validate(self, setting):
        super().validate(setting)
        check_setting(setting)

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

    def at_boot(self, change):
        """An fstab entry for this mount that mount(8) cannot use is an error (FILE:LINE)."""
        fstab.check_host(self.host, self._mount(change.setting.key)[0])
        return change

    def file_edits(self, changes):
        flags = {self._mount(c.setting.key)[0]: "noatime" if c.target else "atime" for c in changes}
        return fstab.persist_edits(self.host, flags)

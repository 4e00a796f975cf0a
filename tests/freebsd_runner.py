"""A stand-in for a FreeBSD host's sysctl(8), mount(8) and cap_mkdb(1),
so the FreeBSD backends run on Linux exactly as they would there: they
only ever talk to a host through the command runner."""

from proxytune.core.errors import BackendError
from proxytune.tune.runner import CommandRunner


class FreeBSDCommands(CommandRunner):
    def __init__(self, sysctls: dict[str, str], mounts: list[tuple[str, str, str, str]]):
        super().__init__()
        self.sysctls = dict(sysctls)
        self.mounts = [list(m) for m in mounts]

    def run(self, argv, check=True):
        self.history.append(list(argv))
        if argv[:2] == ["sysctl", "-n"]:
            if argv[2] not in self.sysctls:
                raise BackendError(f"sysctl: unknown oid '{argv[2]}'")
            return self.sysctls[argv[2]] + "\n"
        if argv[0] == "sysctl" and "=" in argv[1]:
            key, value = argv[1].split("=", 1)
            if key not in self.sysctls:
                raise BackendError(f"sysctl: unknown oid '{key}'")
            self.sysctls[key] = value
            return f"{key}: -> {value}\n"
        if argv == ["mount", "-p"]:
            return "".join(f"{d}\t{mp}\t{t}\t{o}\t0 0\n" for d, mp, t, o in self.mounts)
        if argv[:3] == ["mount", "-u", "-o"]:
            for m in self.mounts:
                if m[1] == argv[4]:
                    opts = [o for o in m[3].split(",") if o not in ("noatime", "atime")]
                    m[3] = ",".join(opts + (["noatime"] if argv[3] == "noatime" else []))
                    return ""
            raise BackendError(f"mount: {argv[4]}: not a mount point")
        if argv[0] == "cap_mkdb":
            return ""
        raise BackendError(f"unexpected command {argv}")

"""proxytune-profile(5): the profile format, from the loader's own constants
(modes, parameters, placeholders) and the backend registry (each backend's
first docstring line), so that the page names what the code accepts."""

import inspect

from proxytune.core.manpage import esc, items

from . import backends, profile

EXAMPLE = '''[profile]
description = "our edge proxies"
os = "linux"
include = ["linux/proxy"]        # inherit; later settings override

[params]
service = "squid"
user = "proxy"

[sysctl."net.core.somaxconn"]
at_least = 16384
reason = "bursty clients behind the load balancer"
source = "our load test of 2026-11"

[rlimit."{service}:nofile"]
at_least = 131072
reason = "two descriptors per proxied connection"
source = "squid.conf max_filedescriptors"'''

MODES = {"value": "exactly this value",
         "at_least": "this or more: a higher value already on the host is kept, never lowered",
         "at_most": "this or less (timeouts)",
         "covers": "a range [first, last] the current range must contain (ip_local_port_range)"}

SEE_ALSO = "proxytune(8), tuned.conf(5), sysctl.d(5), limits.conf(5), systemd.exec(5), fstab(5), login.conf(5)"


def backend_items() -> list[tuple[str, str]]:
    out = []
    for (os_name, kind), cls in sorted(backends.REGISTRY.items()):
        doc = inspect.getdoc(inspect.getmodule(cls)) or ""
        out.append((esc(f"{kind} ({os_name})"), esc(doc.split("\n\n")[0].replace("\n", " "))))
    return out


def proxytune_profile_5(version: str) -> str:
    keys = ", ".join(profile.PROFILE_KEYS)
    lines = [f'.TH PROXYTUNE\\-PROFILE 5 "" "proxytune {version}" "File Formats"',
             ".SH NAME", "proxytune\\-profile \\- declarative tuning profiles for proxytune (TOML)",
             ".SH SYNOPSIS", "/etc/proxytune/profiles/\\fIOS\\fR/\\fINAME\\fR.toml",
             ".br", "~/.config/proxytune/profiles/\\fIOS\\fR/\\fINAME\\fR.toml",
             ".br", "/usr/share/proxytune/profiles/\\fIOS\\fR/\\fINAME\\fR.toml",
             ".SH DESCRIPTION",
             "A profile says, for each knob of the host, what value a web\\-proxy host wants, why, and "
             "where that comes from. The file at \\fIOS\\fR/\\fINAME\\fR.toml is the profile "
             "\\fIOS\\fR/\\fINAME\\fR; the directories above are searched in that order and the first "
             "match wins. A site or user directory or file that is not owned by root (or the user) or "
             "is writable by others is ignored. Every problem is reported as "
             "\\fIfile\\fR:\\fIline\\fR: \\fIkey\\fR: \\fIproblem\\fR before anything is changed.",
             ".SH THE [profile] TABLE", f"Keys: {esc(keys)}.",
             *items([("description", "One line shown by proxytune profiles list."),
                     ("os", esc(f"One of: {', '.join(backends.OSES)}.")),
                     ("include", "Profiles read first; settings here override theirs. A name is "
                                 "looked up in the directories above (never the current directory); "
                                 "shipped:NAME names the shipped profile even where a site or user "
                                 "profile of that name hides it (so a site profile can extend the "
                                 "shipped one of its own name); a path (starting with /, ./ or ../, or "
                                 "ending in .toml) is relative to this file and must pass the same "
                                 "ownership check.")]),
             ".SH THE [params] TABLE",
             esc(f"Defaults for the parameters {', '.join(profile.PARAMS)}; the command line "
                 f"(--service, --user, --cache-dir) overrides them, and they are auto-detected from the "
                 f"running proxy when neither gives them. Keys may use the placeholders "
                 f"{', '.join(profile.PLACEHOLDERS)} ({{cache_dir}}: one setting per cache directory)."),
             ".SH SETTINGS",
             "Each setting is a table \\fB[\\fR\\fIbackend\\fR\\fB.\"\\fR\\fIkey\\fR\\fB\"]\\fR with exactly "
             "one mode and the strings " + esc(" and ".join(profile.SETTING_TEXT)) + ". Modes:",
             *items((esc(m), esc(MODES[m])) for m in profile.MODES),
             ".PP", "Optional keys:",
             *items([(profile.OPTIONAL_TEXT[0], "A reason to leave this setting as it is: tune check reports it "
                               "\\fBwaived\\fR with the reason (never drift), tune apply never changes it."),
                     ("critical", "true: drift of this setting is CRITICAL, not WARNING, in "
                                  "tune check \\-\\-format nagios.")]),
             ".PP", "Text an export's consumer would evaluate (" + esc("{{, {%, {#, ${") + ") is refused in "
             "every key, value and string: an exported playbook or tuned profile never runs it.",
             ".SH BACKENDS", *items(backend_items()),
             ".SH EXAMPLE", ".nf", esc(EXAMPLE), ".fi",
             ".SH SEE ALSO", SEE_ALSO]
    return "\n".join(lines) + "\n"

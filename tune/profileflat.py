"""A loaded profile written back as one self-contained TOML file: its includes
merged in, its parameters, waivers and critical marks kept.

Why: a profile travels (`fleet` bundles it for every host) as the controller
resolved it. Sent as a name, each host looked the name up again and found the
shipped profile, not the site's override with its waivers; sent as a file, its
includes were looked up again there. The flat file names no other profile, so
every host loads exactly what the controller loaded. Each setting says where it
came from (file:line) in a comment.
"""

import json

from .profile import Profile, RawSetting


def _string(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's: \\" \\\\ \\n \\uXXXX)."""
    return json.dumps(text, ensure_ascii=False)


def _value(v) -> str:
    """A parsed value as TOML that parses back to it (values.parse): a range is a list of ints."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, tuple):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return _string(str(v))


def _setting(r: RawSetting) -> list[str]:
    lines = [f"# from {ascii(str(r.path))[1:-1]}:{r.line or '?'}",
             f"[{r.backend}.{_string(r.key)}]",
             f"{r.mode} = {_value(r.wanted)}",
             f"reason = {_string(r.reason)}",
             f"source = {_string(r.source)}"]
    lines += [f"waive = {_string(r.waive)}"] if r.waive else []
    lines += ["critical = true"] if r.critical else []
    return lines + [""]


def flatten(profile: Profile) -> str:
    """The TOML text of `profile` as load() merged it (no include left)."""
    out = [f"# proxytune profile {ascii(profile.name)[1:-1]} as resolved from {ascii(str(profile.path))[1:-1]},",
           "# with its includes merged (written by proxytune for `fleet`).", "",
           "[profile]", f"description = {_string(profile.description)}", f"os = {_string(profile.os)}", ""]
    if profile.params:
        out += ["[params]"] + [f"{k} = {_params_value(v)}" for k, v in profile.params.items()] + [""]
    for r in profile.raw:
        out += _setting(r)
    return "\n".join(out)


def _params_value(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_string(str(x)) for x in v) + "]"
    return _string(str(v))

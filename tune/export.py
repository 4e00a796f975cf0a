"""Render a profile into the formats other tools apply: sysctl.d, limits.d,
systemd drop-ins, tuned, an Ansible playbook, and FreeBSD's config files.

Every export keeps the promise "never lowers" as its consumer loads it:
where a format can say "at least" (tuned's `>`, pam_limits' use_max, a
guarded Ansible task) it does; where it cannot (sysctl.d, tuned ranges),
the values are computed against the host the export is made on and the
file says so (export_host.py). A setting the format cannot carry is
listed, never silently dropped.
"""

import json
import re
import shlex
from dataclasses import dataclass, field

from . import export_host, params as params_mod, plan as plan_mod, profile as profile_mod
from .backends.freebsd_conf import set_keys
from .backends.freebsd_login import set_cap
from .backends.limits import render_limits
from .backends.sysctl import render_conf
from .backends.systemd import DROPIN_NAME, render_dropin
from proxytune.core.errors import ProxytuneError
from proxytune import proxies
from .model import Setting
from .values import render

FORMATS = ("sysctl.d", "limits.d", "systemd", "tuned", "ansible", "freebsd")
LINUX_ONLY = ("sysctl.d", "limits.d", "systemd", "tuned", "ansible")
MODE_NOTE = {"at_least": "at least", "at_most": "at most", "covers": "a range covering"}


@dataclass
class Target:
    """Where the export goes: the host it is computed on (None: not computed), and the
    parameters left as variables, with the defaults this host suggests (see as_variables)."""
    host: object = None
    tuned_include: str | None = None
    variables: dict = field(default_factory=dict)


# A service or user that this host detected is not baked into an export made for other hosts: the
# profile is expanded with these stand-ins (valid names, so every backend checks them as usual), which
# become Ansible variables in a playbook and documented placeholders in the other files.
STAND_INS = {"service": "proxytune-service-var", "user": "proxytune-user-var"}
PLACEHOLDER = {"service": "@PROXY_SERVICE@", "user": "@PROXY_USER@"}
EXPLICIT = ("command line", "profile")
VAR_NAME = {"service": "proxytune_service", "user": "proxytune_user"}


def as_variables(values: dict, sources: dict) -> tuple[dict, dict]:
    """(values to expand the profile with, {param: default} of those left as variables): a service or
    user given on the command line or by the profile is written in; a detected one is a variable."""
    variables = {k: values[k] for k in STAND_INS if sources.get(k) not in EXPLICIT}
    return {**values, **{k: STAND_INS[k] for k in variables}}, variables


def _placeholders(text: str, variables: dict) -> str:
    """The stand-ins as placeholders, each explained once at the top, with the value this host has."""
    used = [k for k in variables if STAND_INS[k] in text]
    for k in used:
        text = text.replace(STAND_INS[k], PLACEHOLDER[k])
    head = "".join(f"# {PLACEHOLDER[k]}: the proxy's {k} on the target host (here: {variables[k]}); replace it, "
                   f"or export with --{k} NAME to write a name in\n" for k in used)
    first = text.find("\n") + 1
    return text[:first] + head + text[first:]


def export_profile(host, profile_ref: str, cli_params: dict, fmt: str, only: tuple = (), skip: tuple = (),
                   tuned_include: str | None = None) -> str:
    """`tune export`: the profile as fmt, computed against host (parameters resolved here, a detected
    service or user left as a variable), with the settings --only/--skip select."""
    prof = profile_mod.load(profile_ref, root=host.root)
    values, variables = as_variables(*params_mod.resolve(host, cli_params, prof.params))
    settings, _ = profile_mod.expand(prof, values, host)
    if tuned_include is not None and not export_host.NAME.fullmatch(tuned_include):
        raise ProxytuneError(f"--tuned-include {tuned_include!r} is not a tuned profile name")
    return export(fmt, plan_mod.select(settings, only, skip), profile_ref, prof.os,
                  Target(host, tuned_include, variables))


def export(fmt: str, settings: list[Setting], profile: str, os_name: str, target: Target | None = None) -> str:
    if fmt in LINUX_ONLY and os_name != "linux":
        raise ProxytuneError(f"--format {fmt} is for Linux profiles; {profile} is for {os_name}",
                             "use --format freebsd")
    if fmt == "freebsd" and os_name != "freebsd":
        raise ProxytuneError(f"--format freebsd needs a FreeBSD profile; {profile} is for {os_name}",
                             "try --profile freebsd/proxy")
    target = target or Target()
    text = _waivers(RENDERERS[fmt]([s for s in settings if not s.waive], profile, target), settings)
    return text if fmt == "ansible" else _placeholders(text, target.variables)


def _waivers(text: str, settings) -> str:
    """A waived setting is in no export: each one is named, with the profile's reason, below the first line."""
    lines = "".join(f"# waived: {s.address}: {s.waive}\n" for s in settings if s.waive)
    first = text.find("\n") + 1
    return text[:first] + lines + text[first:]


def _header(profile: str, fmt: str) -> str:
    """Whoever installs an export owns it: no journal entry covers it, so rollback cannot undo it."""
    return (f"# proxytune profile {profile}, exported as {fmt}.\n"
            "# Made by `proxytune tune export`, not by `tune apply`: no journal entry covers it, and\n"
            "# `proxytune tune rollback` does not undo it.\n")


DROPIN_UNDO = "# Exported by proxytune: to undo, remove this file, then daemon-reload and restart the service.\n"


def _left_out(settings, taken, fmt) -> str:
    rest = [s.address for s in settings if s not in taken]
    return "".join(f"# not expressible as {fmt}: {a}\n" for a in rest)


def _mode_comments(settings) -> str:
    return "".join(f"# {s.key}: the profile asks for {MODE_NOTE[s.mode]} {render(s.wanted)}; "
                   "this file sets it exactly\n" for s in settings if s.mode in MODE_NOTE)


def sysctl_d(settings, profile, target):
    """Never lowers as `sysctl --system` loads it: computed against the target host."""
    mine = [s for s in settings if s.backend == "sysctl"]
    head = _header(profile, "sysctl.d") + ("# Install as /etc/sysctl.d/90-proxytune.conf; load with `sysctl --system`.\n"
                                           "# To undo: remove this file; live values keep until the next boot.\n")
    lines = export_host.computed(mine, target.host, "linux")
    if lines is None:
        head += "# Not computed against a host: the profile's values, written exactly.\n" + _mode_comments(mine)
        return render_conf({s.key: render(s.wanted) for s in mine}, header=head + _left_out(settings, mine, "sysctl.d"))
    head += export_host.computed_on(target.host)
    head += "".join(f"# {s.key}: {lines[s.address].note}\n" for s in mine if lines[s.address].note)
    values = {s.key: lines[s.address].value for s in mine if lines[s.address].value is not None}
    return render_conf(values, header=head + _left_out(settings, mine, "sysctl.d"))


def limits_d(settings, profile, target=None):
    mine = [s for s in settings if s.backend == "limits"]
    rows = {tuple(s.key.rsplit(":", 1)): str(s.wanted) for s in mine}
    head = _header(profile, "limits.d") + "# Install as /etc/security/limits.d/90-proxytune.conf.\n"
    undo = "# To undo: remove this file; new login sessions then get the previous limits."
    return head + _left_out(settings, mine, "limits.d") + render_limits(rows, header=undo)


def systemd(settings, profile, target=None):
    mine = [s for s in settings if s.backend == "service"]
    out = _header(profile, "systemd drop-ins") + _left_out(settings, mine, "systemd")
    units: dict[str, dict] = {}
    for s in mine:
        unit, _, directive = s.key.rpartition(":")
        units.setdefault(unit, {})[directive] = str(s.wanted)
    for unit, directives in sorted(units.items()):
        out += f"\n# /etc/systemd/system/{unit}.service.d/{DROPIN_NAME}\n" + render_dropin(directives, DROPIN_UNDO)
    return out


def tuned(settings, profile, target):
    """tuned.conf over a base profile: `>`/`<` where tuned has them (it then
    never lowers), values computed against this host where it has not."""
    mine = [s for s in settings if s.backend == "sysctl"]
    version = export_host.tuned_version()
    base, why = export_host.tuned_base(target.tuned_include)
    where = export_host.tuned_profile_dir(version)
    found = "tuned " + ".".join(map(str, version)) if version else "no tuned installed here"
    lines = [_header(profile, "tuned").rstrip(),
             f"# Install as {where}/tuned.conf ({found}; tuned < 2.24 reads /etc/tuned/NAME,",
             "# 2.24 and later /etc/tuned/profiles/NAME), then `tuned-adm profile proxytune`.",
             "# To undo: `tuned-adm profile` the one `tuned-adm active` named before, then remove this profile.",
             f"# Includes {base} ({why}), so activating it keeps that tuning.",
             "# tuned-main.conf reapply_sysctl=1 (the default) re-applies /etc/sysctl.d after this profile,",
             "# so a value there wins; proxytune's sysctl.d export never lowers, so the two agree.",
             "# tuned has no plugin for fd limits or mount options (tuned#449, #126):"]
    lines += [f"#   not expressible as tuned: {s.address}" for s in settings if s not in mine]
    need_host = [s for s in mine if s.mode in MODE_NOTE and not isinstance(s.wanted, int)]
    computed = export_host.computed(mine, target.host, "linux") or {}
    if need_host:
        lines.append(export_host.computed_on(target.host).rstrip() if computed else
                     "# Not computed against a host: ranges are the profile's values, written exactly.")
    body = ["[main]", f"summary=proxytune {profile}", f"include={base}", "", "[sysctl]"]
    for s in mine:
        line = computed.get(s.address)
        if line and (s in need_host or not line.readable):
            lines += [f"# {s.key}: {line.note}"] if line.note else []
            if line.value is not None:
                body.append(f"{s.key}={line.value}")
            continue
        prefix = {"at_least": ">", "at_most": "<"}.get(s.mode, "") if isinstance(s.wanted, int) else ""
        body.append(f"{s.key}={prefix}{render(s.wanted)}")
    return _inert_for_tuned("\n".join(lines + body) + "\n")


def _inert_for_tuned(text: str) -> str:
    """tuned expands ${...} in every value it loads (${f:exec:...} runs a command as root):
    refused here too, for settings that did not come through profile.load()."""
    if "${" in text:
        line = next(l for l in text.splitlines() if "${" in l)
        raise ProxytuneError(f"tuned would expand '${{' in {line[:80]!r} (and ${{f:exec:...}} runs a command)",
                             "remove it from the profile; nothing was written")
    return text


def _q(text) -> str:
    """A YAML scalar: JSON strings are valid YAML."""
    return json.dumps(str(text))


def _u(text) -> str:
    """A YAML scalar tagged !unsafe: Ansible keeps it as data and never templates it
    (a profile's `{{ lookup('pipe', ...) }}` would otherwise run on the controller)."""
    return "!unsafe " + _q(text)


def _argv(*words) -> list[str]:
    """An argv list for ansible.builtin.command: no shell ever sees these words."""
    return ["      ansible.builtin.command:", "        argv: " + json.dumps([str(w) for w in words])]


READ = ["      changed_when: false", "      failed_when: false", "      check_mode: false"]


def ansible(settings, profile, target=None):
    """A playbook for ansible-playbook: the same profile, fleet-wide, never
    lowering; --check --diff reports only what would really change."""
    out = [_header(profile, "an Ansible playbook").rstrip(),
           "# Run: ansible-playbook -i HOSTS proxytune.yml   (needs ansible.posix and community.general)",
           "# Dry run: ansible-playbook -i HOSTS proxytune.yml --check --diff (reads run, writes are only shown;",
           "# community.general.pam_limits still creates its dest file empty under --check when it is absent)",
           "# To undo: remove the files it writes (the proxytune_* vars, the drop-ins) and its fstab noatime;",
           "# live values keep until the next boot.",
           f"- name: {_u('proxytune profile ' + profile)}",
           "  hosts: all", "  become: true", "  gather_facts: false", "  vars:",
           *(f"    {VAR_NAME[k]}: {_q(v)}   # the proxy's {k} (detected on the exporting host): -e {VAR_NAME[k]}=..."
             for k, v in target.variables.items()),
           "    proxytune_sysctl_file: /etc/sysctl.d/90-proxytune.conf",
           "    proxytune_limits_file: /etc/security/limits.d/90-proxytune.conf",
           "    proxytune_systemd_dir: /etc/systemd/system",
           "  handlers:", "    - name: reload systemd", "      ansible.builtin.systemd:",
           "        daemon_reload: true",
           "      when: proxytune_systemd_pid1.stat.exists   # only where systemd runs as PID 1",
           "  tasks:",
           "    - name: is systemd PID 1 here",
           "      ansible.builtin.stat:", "        path: /run/systemd/system",
           "      register: proxytune_systemd_pid1", "      check_mode: false"]
    out += _variable_checks(target.variables)
    for n, s in enumerate(settings):
        out += TASKS[s.backend](s, f"pt_{n}")
    text = "\n".join(out) + "\n"
    for k in target.variables:          # what is left: plain text (names, paths, YAML strings)
        text = _untag_stand_in(text, STAND_INS[k]).replace(STAND_INS[k], "{{ " + VAR_NAME[k] + " }}")
    return text


def _untag_stand_in(text: str, stand_in: str) -> str:
    """A scalar holding a stand-in must be templated to take the variable, so it loses `!unsafe`.
    Safe: load() refused every `{{`, `{%`, `{#` in the profile, and the stand-in is our own name."""
    return re.sub(r'!unsafe ("(?:[^"\\]|\\.)*' + re.escape(stand_in) + r'(?:[^"\\]|\\.)*")', r"\1", text)


def _variable_checks(variables: dict) -> list[str]:
    """A variable set with -e is checked as the profile's names are, before any task uses it."""
    return [line for k in variables for line in (
        f"    - name: {_q(VAR_NAME[k] + ' is a plain name')}", "      ansible.builtin.assert:",
        f"        that: \"{VAR_NAME[k]} is match('^[A-Za-z0-9_][A-Za-z0-9_.@-]*$')\"",
        f"        fail_msg: \"{VAR_NAME[k]} must be a plain {k} name\"")]


def _sysctl_tasks(s, reg):
    cur = f"({reg}.stdout.split()"
    read = [f"    - name: {_u('read ' + s.key)}", *_argv("sysctl", "-n", s.key), f"      register: {reg}", *READ]
    data = []           # task vars tagged !unsafe: compared as data in `when`, never templated
    if s.mode == "covers":
        lo, hi = s.wanted
        value = f"{{{{ [{cur}[0] | int), {lo}] | min }}}} {{{{ [{cur}[1] | int), {hi}] | max }}}}"
        cond = f"{cur}[0] | int) > {lo} or {cur}[1] | int) < {hi}"
    elif s.mode in ("at_least", "at_most") and isinstance(s.wanted, int):
        value = _u(render(s.wanted))
        cond = f"({reg}.stdout | int) {'<' if s.mode == 'at_least' else '>'} {s.wanted}"
    elif s.mode in ("at_least", "at_most"):
        pick = "max" if s.mode == "at_least" else "min"
        value = " ".join(f"{{{{ [{cur}[{i}] | int), {w}] | {pick} }}}}" for i, w in enumerate(s.wanted))
        cond = " or ".join(f"{cur}[{i}] | int) {'<' if pick == 'max' else '>'} {w}" for i, w in enumerate(s.wanted))
    else:
        value = _u(render(s.wanted))
        data = ["      vars:", f"        {reg}_want: {value}"]
        cond = f"{reg}.stdout.split() | join(' ') != {reg}_want"
    if not value.startswith("!unsafe"):
        value = _q(value)           # the Jinja this module computes from the value read
    return read + [
        f"    - name: {_u(s.key + ' ' + s.wanted_text + ' (' + s.reason + ')')}",
        "      ansible.posix.sysctl:", f"        name: {_u(s.key)}", f"        value: {value}",
        "        sysctl_file: \"{{ proxytune_sysctl_file }}\"", "        sysctl_set: true", "        reload: false",
        *data, f"      when: {reg}.rc == 0 and ({cond})"]


def _literal_regex(word: str) -> str:
    """A regex matching `word` literally, with no backslash (it passes through YAML and Jinja)."""
    return "".join(c if c.isalnum() or c in "_-@" else f"[{c}]" for c in word)


# What pam_limits reads, in its order; the last soft (or -) line for the domain wins.
LIMITS_READ = "cat /etc/security/limits.conf /etc/security/limits.d/*.conf 2>/dev/null; true"


def _limits_tasks(s, reg):
    """Read the effective login limit first, so a met one is neither changed nor shown as a change."""
    domain, _, item = s.key.rpartition(":")
    line = f"^[ \t]*{_literal_regex(domain)}[ \t]+(soft|-)[ \t]+{_literal_regex(item)}[ \t]"
    pattern = repr(line)
    if domain == STAND_INS["user"]:     # the variable, escaped for the regex when Jinja evaluates it
        head, tail = line.split(_literal_regex(domain), 1)
        pattern = f"({head!r} ~ (proxytune_user | regex_escape) ~ {tail!r})"
    current = (f"({reg}.stdout_lines | select('match', {pattern}) | map('split') "
               "| map('last') | list | last | default(''))")
    met = (f"{current} == 'unlimited' or ({current} | int) >= {s.wanted}" if s.mode == "at_least"
           else f"{current} == {str(s.wanted)!r}")
    return [f"    - name: {_u('read login limits for ' + domain)}", *_argv("sh", "-c", LIMITS_READ),
            f"      register: {reg}", *READ,
            f"    - name: {_u(s.address + ' ' + s.wanted_text)}",
            "      community.general.pam_limits:", f"        domain: {_u(domain)}",
            "        limit_type: \"-\"", f"        limit_item: {_u(item)}", f"        value: {_u(s.wanted)}",
            f"        use_max: {'true' if s.mode == 'at_least' else 'false'}",
            "        dest: \"{{ proxytune_limits_file }}\"",
            f"      when: {_q('not (' + met + ')')}"]


def _service_tasks(s, reg):
    unit, _, directive = s.key.rpartition(":")
    folder = f"{{{{ proxytune_systemd_dir }}}}/{unit}.service.d"
    return [f"    - name: {_u('drop-in directory for ' + unit)}",
            "      ansible.builtin.file:", f"        path: {_q(folder)}", "        state: directory",
            "        mode: \"0755\"",
            f"    - name: {_u(s.address + ' = ' + render(s.wanted))}",
            "      ansible.builtin.copy:",
            f"        dest: {_q(folder + '/' + DROPIN_NAME)}",
            f"        content: {_u(render_dropin({directive: str(s.wanted)}, DROPIN_UNDO))}",
            "      notify: reload systemd"]


RLIMIT_NAME = re.compile(r"[a-z]+")
# core.proxytree's rule as a shell on the host can apply it (no systemd query: the unit is not known here):
# a process named $n counts when the top of its chain of proxy executables (the registry's, and $n) runs
# as root (real, effective, saved uid 0) from a root-owned file not writable by others, in directories
# the same (a sticky one aside), all as that process sees them.
TREE_RULE = r"""masters=" {masters} $n "
ok() {{ find -L "$1" -maxdepth 0 -user 0 \( ! -perm /022 -o \( -type d -perm /1000 \) \) | grep -q .; }}
for p in $(pgrep -x -- "$n"); do
 t=$p
 while q=$(ps -o ppid= -p "$t" | tr -d ' ') && [ "${{q:-0}}" -gt 1 ] && e=$(readlink "/proc/$q/exe") && case "$masters" in *" ${{e##*/}} "*) true ;; *) false ;; esac; do t=$q; done
 set -- $(ps -o ruid=,euid=,suid= -p "$t"); [ "$1$2$3" = 000 ] || continue
 x=$(readlink "/proc/$t/exe") || continue; x=${{x% (deleted)}}
 case "$masters" in *" ${{x##*/}} "*) ;; *) continue ;; esac
 ok "/proc/$t/exe" && ok "/proc/$t/root/" || continue
 d=${{x%/*}}; good=1; while [ -n "$d" ]; do ok "/proc/$t/root$d" || good=0; d=${{d%/*}}; done; [ "$good" = 1 ] || continue
"""

MASTERS = " ".join(sorted({x for k in proxies.KINDS for x in (*k.exe_names, *k.managers)}))   # the registry's


def _rlimit_tasks(s, reg):
    """prlimit on the running processes of that name that belong to a proxy's service by TREE_RULE:
    never a local user's (nor a service account's) program of the proxy's name."""
    service, _, name = s.key.rpartition(":")
    if not RLIMIT_NAME.fullmatch(name) or not isinstance(s.wanted, int):
        raise ProxytuneError(f"{s.address}: cannot render {name!r} = {s.wanted!r} as a prlimit task")
    n = s.wanted
    quoted = "{{ proxytune_service | quote }}" if service == STAND_INS["service"] else shlex.quote(service)
    script = (f"n={quoted}\n" + TREE_RULE.format(masters=MASTERS) +
              f" s=$(prlimit --pid \"$p\" --{name} -o SOFT --noheadings)\n"
              f" [ \"$s\" = unlimited ] || [ \"$s\" -ge {n} ] || {{ prlimit --pid \"$p\" --{name}={n}:{n} && echo changed; }}\n"
              "done\n")
    return [f"    - name: {_u(s.address + ' ' + s.wanted_text + ' on running processes')}",
            f"      ansible.builtin.shell: {_u(script)}", f"      register: {reg}",
            f"      changed_when: \"'changed' in {reg}.stdout\""]


def _mount_tasks(s, reg):
    path = s.key.rpartition(":")[0]
    return [f"    - name: {_u('mount point of ' + path)}", *_argv("findmnt", "-n", "-o", "TARGET", "--target", path),
            f"      register: {reg}", *READ,
            f"    - name: {_u('noatime in /etc/fstab for ' + path)}",
            "      ansible.builtin.replace:", "        path: /etc/fstab",
            f"        regexp: '^(\\s*\\S+\\s+{{{{ {reg}.stdout | regex_escape }}}}\\s+\\S+\\s+)(?!\\S*noatime)(\\S+)(.*)$'",
            "        replace: '\\1\\2,noatime\\3'", f"      when: {reg}.rc == 0",
            f"    - name: {_u('remount ' + path + ' with noatime')}",
            "      ansible.posix.mount:", f"        path: \"{{{{ {reg}.stdout }}}}\"",
            "        state: remounted", "        opts: noatime", f"      when: {reg}.rc == 0"]


TASKS = {"sysctl": _sysctl_tasks, "limits": _limits_tasks, "service": _service_tasks,
         "rlimit": _rlimit_tasks, "mount": _mount_tasks}


def freebsd(settings, profile, target=None):
    """The FreeBSD files: sysctl.conf, loader.conf, login.conf, fstab options."""
    def pick(kind):
        return {s.key: render(s.wanted) for s in settings if s.backend == kind}
    out = [_header(profile, "FreeBSD configuration").rstrip(), "# To undo: take these lines out of each file again.",
           _mode_comments(settings).rstrip()]
    out += ["", "# ---- /etc/sysctl.conf (live now: service sysctl restart)",
            set_keys("", pick("sysctl")).replace("# proxytune\n", "").rstrip()]
    out += ["", "# ---- /boot/loader.conf (takes effect at the next boot)",
            set_keys("", pick("loader"), quote=True).replace("# proxytune\n", "").rstrip()]
    login = ""
    for key, value in pick("login").items():
        klass, _, cap = key.rpartition(":")
        login = set_cap(login, klass, cap, value)
    out += ["", "# ---- /etc/login.conf: merge into these class entries, then: cap_mkdb /etc/login.conf", login.rstrip()]
    mounts = [s.key.rpartition(":")[0] for s in settings if s.backend == "mount"]
    out += ["", "# ---- /etc/fstab: add noatime to the options of the mounts holding"]
    out += [f"#   {m}   (live now: mount -u -o noatime MOUNTPOINT)" for m in mounts] or ["#   (no cache directories)"]
    return "\n".join(line for line in out if line is not None) + "\n"


RENDERERS = {"sysctl.d": sysctl_d, "limits.d": limits_d, "systemd": systemd, "tuned": tuned,
             "ansible": ansible, "freebsd": freebsd}

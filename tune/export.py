"""Render a profile into the formats other tools apply: sysctl.d, limits.d,
systemd drop-ins, tuned, an Ansible playbook, and FreeBSD's config files.

Exports carry the profile's wanted values, since the target hosts are not
this one. Where a format can say "at least" (tuned's `>`, pam_limits'
use_max, a guarded Ansible task) it does; where it cannot, a comment says
so. A setting the format cannot carry is listed, never silently dropped.
"""

import json

from .backends.freebsd_conf import set_keys
from .backends.freebsd_login import set_cap
from .backends.limits import render_limits
from .backends.sysctl import render_conf
from .backends.systemd import render_dropin
from .errors import ProxytuneError
from .model import Setting
from .values import render

FORMATS = ("sysctl.d", "limits.d", "systemd", "tuned", "ansible", "freebsd")
LINUX_ONLY = ("sysctl.d", "limits.d", "systemd", "tuned", "ansible")
MODE_NOTE = {"at_least": "at least", "at_most": "at most", "covers": "a range covering"}


def export(fmt: str, settings: list[Setting], profile: str, os_name: str) -> str:
    if fmt in LINUX_ONLY and os_name != "linux":
        raise ProxytuneError(f"--format {fmt} is for Linux profiles; {profile} is for {os_name}",
                             "use --format freebsd")
    if fmt == "freebsd" and os_name != "freebsd":
        raise ProxytuneError(f"--format freebsd needs a FreeBSD profile; {profile} is for {os_name}",
                             "try --profile freebsd/proxy")
    return RENDERERS[fmt](settings, profile)


def _header(profile: str, fmt: str) -> str:
    return f"# proxytune profile {profile}, exported as {fmt}.\n"


def _left_out(settings, taken, fmt) -> str:
    rest = [s.address for s in settings if s not in taken]
    return "".join(f"# not expressible as {fmt}: {a}\n" for a in rest)


def _mode_comments(settings) -> str:
    return "".join(f"# {s.key}: the profile asks for {MODE_NOTE[s.mode]} {render(s.wanted)}; "
                   "this file sets it exactly\n" for s in settings if s.mode in MODE_NOTE)


def sysctl_d(settings, profile):
    mine = [s for s in settings if s.backend == "sysctl"]
    head = _header(profile, "sysctl.d") + "# Install as /etc/sysctl.d/90-proxytune.conf; load with `sysctl --system`.\n"
    head += _mode_comments(mine) + _left_out(settings, mine, "sysctl.d")
    return render_conf({s.key: render(s.wanted) for s in mine}, header=head)


def limits_d(settings, profile):
    mine = [s for s in settings if s.backend == "limits"]
    rows = {tuple(s.key.rsplit(":", 1)): str(s.wanted) for s in mine}
    head = _header(profile, "limits.d") + "# Install as /etc/security/limits.d/90-proxytune.conf.\n"
    return head + _left_out(settings, mine, "limits.d") + render_limits(rows)


def systemd(settings, profile):
    mine = [s for s in settings if s.backend == "service"]
    out = _header(profile, "systemd drop-ins") + _left_out(settings, mine, "systemd")
    units: dict[str, dict] = {}
    for s in mine:
        unit, _, directive = s.key.rpartition(":")
        units.setdefault(unit, {})[directive] = str(s.wanted)
    for unit, directives in sorted(units.items()):
        out += f"\n# /etc/systemd/system/{unit}.service.d/proxytune.conf\n" + render_dropin(directives)
    return out


def tuned(settings, profile):
    """tuned.conf: sysctls with tuned's > and < assignment modifiers."""
    mine = [s for s in settings if s.backend == "sysctl"]
    lines = [_header(profile, "tuned").rstrip(),
             "# Install as /etc/tuned/proxytune/tuned.conf; `tuned-adm profile proxytune`.",
             "# tuned has no plugin for fd limits or mount options (tuned#449, #126):"]
    lines += [f"#   not expressible as tuned: {s.address}" for s in settings if s not in mine]
    lines += ["[main]", f"summary=proxytune {profile}", "", "[sysctl]"]
    for s in mine:
        prefix = {"at_least": ">", "at_most": "<"}.get(s.mode, "") if isinstance(s.wanted, int) else ""
        lines.append(f"{s.key}={prefix}{render(s.wanted)}")
    return "\n".join(lines) + "\n"


def _q(text) -> str:
    """A YAML scalar: JSON strings are valid YAML."""
    return json.dumps(str(text))


def ansible(settings, profile):
    """A playbook for ansible-playbook: the same profile, fleet-wide, never lowering."""
    out = [_header(profile, "an Ansible playbook").rstrip(),
           "# Run: ansible-playbook -i HOSTS proxytune.yml   (needs ansible.posix and community.general)",
           f"- name: {_q('proxytune profile ' + profile)}",
           "  hosts: all", "  become: true", "  gather_facts: false", "  vars:",
           "    proxytune_sysctl_file: /etc/sysctl.d/90-proxytune.conf",
           "    proxytune_limits_file: /etc/security/limits.d/90-proxytune.conf",
           "    proxytune_systemd_dir: /etc/systemd/system",
           "  handlers:", "    - name: reload systemd", "      ansible.builtin.systemd:",
           "        daemon_reload: true", "  tasks:"]
    for n, s in enumerate(settings):
        out += TASKS[s.backend](s, f"pt_{n}")
    return "\n".join(out) + "\n"


def _sysctl_tasks(s, reg):
    cur = f"({reg}.stdout.split()"
    read = [f"    - name: {_q('read ' + s.key)}",
            f"      ansible.builtin.command: {_q('sysctl -n ' + s.key)}",
            f"      register: {reg}", "      changed_when: false", "      failed_when: false"]
    if s.mode == "covers":
        lo, hi = s.wanted
        value = f"{{{{ [{cur}[0] | int), {lo}] | min }}}} {{{{ [{cur}[1] | int), {hi}] | max }}}}"
        cond = f"{cur}[0] | int) > {lo} or {cur}[1] | int) < {hi}"
    elif s.mode in ("at_least", "at_most"):
        value = render(s.wanted)
        cond = f"({reg}.stdout | int) {'<' if s.mode == 'at_least' else '>'} {s.wanted}"
    else:
        value = render(s.wanted)
        cond = f"{reg}.stdout.split() | join(' ') != {_q(value)}"
    return read + [
        f"    - name: {_q(s.key + ' ' + s.wanted_text + ' (' + s.reason + ')')}",
        "      ansible.posix.sysctl:", f"        name: {s.key}", f"        value: {_q(value)}",
        "        sysctl_file: \"{{ proxytune_sysctl_file }}\"", "        sysctl_set: true", "        reload: false",
        f"      when: {reg}.rc == 0 and ({cond})"]


def _limits_tasks(s, reg):
    domain, _, item = s.key.rpartition(":")
    return [f"    - name: {_q(s.address + ' ' + s.wanted_text)}",
            "      community.general.pam_limits:", f"        domain: {_q(domain)}",
            "        limit_type: \"-\"", f"        limit_item: {item}", f"        value: {s.wanted}",
            f"        use_max: {'true' if s.mode == 'at_least' else 'false'}",
            "        dest: \"{{ proxytune_limits_file }}\""]


def _service_tasks(s, reg):
    unit, _, directive = s.key.rpartition(":")
    return [f"    - name: {_q(s.address + ' = ' + render(s.wanted))}",
            "      ansible.builtin.copy:",
            f"        dest: \"{{{{ proxytune_systemd_dir }}}}/{unit}.service.d/proxytune.conf\"",
            f"        content: {_q(render_dropin({directive: str(s.wanted)}))}",
            "      notify: reload systemd"]


def _rlimit_tasks(s, reg):
    service, _, name = s.key.rpartition(":")
    n = s.wanted
    script = (f"for p in $(pgrep -x {service}); do s=$(prlimit --pid $p --{name} -o SOFT --noheadings); "
              f"[ \"$s\" = unlimited ] || [ \"$s\" -ge {n} ] || {{ prlimit --pid $p --{name}={n}:{n} && echo changed; }}; done")
    return [f"    - name: {_q(s.address + ' ' + s.wanted_text + ' on running processes')}",
            f"      ansible.builtin.shell: {_q(script)}", f"      register: {reg}",
            f"      changed_when: \"'changed' in {reg}.stdout\""]


def _mount_tasks(s, reg):
    path = s.key.rpartition(":")[0]
    return [f"    - name: {_q('mount point of ' + path)}",
            f"      ansible.builtin.command: {_q('findmnt -n -o TARGET --target ' + path)}",
            f"      register: {reg}", "      changed_when: false", "      failed_when: false",
            f"    - name: {_q('noatime in /etc/fstab for ' + path)}",
            "      ansible.builtin.replace:", "        path: /etc/fstab",
            f"        regexp: '^(\\s*\\S+\\s+{{{{ {reg}.stdout | regex_escape }}}}\\s+\\S+\\s+)(?!\\S*noatime)(\\S+)(.*)$'",
            "        replace: '\\1\\2,noatime\\3'", f"      when: {reg}.rc == 0",
            f"    - name: {_q('remount ' + path + ' with noatime')}",
            "      ansible.posix.mount:", f"        path: \"{{{{ {reg}.stdout }}}}\"",
            "        state: remounted", "        opts: noatime", f"      when: {reg}.rc == 0"]


TASKS = {"sysctl": _sysctl_tasks, "limits": _limits_tasks, "service": _service_tasks,
         "rlimit": _rlimit_tasks, "mount": _mount_tasks}


def freebsd(settings, profile):
    """The FreeBSD files: sysctl.conf, loader.conf, login.conf, fstab options."""
    def pick(kind):
        return {s.key: render(s.wanted) for s in settings if s.backend == kind}
    out = [_header(profile, "FreeBSD configuration").rstrip(), _mode_comments(settings).rstrip()]
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

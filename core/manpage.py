"""proxytune(8), generated from the click command tree (each command's
docstring, each option's help) so that it cannot drift from `--help`, plus
the roff helpers tune/profilepage.py's proxytune-profile(5) shares. The .deb
installs both pages; `proxytune man` prints or installs them for a pipx user."""

import inspect

import click

EXAMPLES = [
    ("proxytune tune check", "Audit this host against the default profile (exit 1 when something drifts)."),
    ("proxytune tune check \\-\\-profile linux/squid \\-\\-json", "The same as result JSON, for a script."),
    ("proxytune tune plan \\-\\-persist", "What apply would change, changing nothing."),
    ("proxytune tune apply \\-\\-persist \\-\\-yes", "Change it, journaled; proxytune tune rollback \\-\\-yes undoes it."),
    ("proxytune tune export \\-\\-format sysctl.d \\-o 90\\-proxy.conf", "The profile for a configuration system."),
    ("proxytune doctor \\-\\-comm squid", "Name what limits the running proxy, with evidence and a fix."),
    ("proxytune report", "Audit, run the quick benchmarks, write proxytune\\-report/report.html."),
    ("systemctl enable \\-\\-now proxytune.timer", "(Debian package) audit every 15 minutes into the "
                                                 "Prometheus node exporter's textfile directory."),
    ("proxytune watch history \\-\\-since 2h", "What limited the proxy in the last two hours (the watcher's "
                                               "episodes; systemctl enable \\-\\-now proxytune\\-watch.service)."),
    ("proxytune man | man \\-l \\-", "Read this page where no man page is installed (pipx)."),
    ("eval \"$(proxytune completion bash)\"", "Shell completion (also zsh, fish)."),
]

ENVIRONMENT = [
    ("PROXYTUNE_ROOT, PROXYTUNE_STATE_DIR", "Defaults for \\-\\-root and \\-\\-state\\-dir."),
    ("PROXYTUNE_FORMAT", "Default for \\-\\-format (table or tsv)."),
    ("PROXYTUNE_LOCK_DIR", "Where apply and rollback take the host\\-wide lock [/run/proxytune]."),
    ("PROXYTUNE_JOURNAL_SOCKET, PROXYTUNE_SYSLOG_SOCKET",
     "Where apply and rollback send their log line [/run/systemd/journal/socket, else /dev/log]; "
     "used only in a directory private to the user running proxytune, never through a link."),
    ("PROXYTUNE_CACHE_DIR", "Where the C harnesses are built [/var/cache/proxytune as root, "
                            "else $XDG_CACHE_HOME/proxytune]."),
    ("XDG_CONFIG_HOME", "The user's profiles are in $XDG_CONFIG_HOME/proxytune/profiles [~/.config]."),
]

FILES = [
    ("/etc/proxytune/profiles/", "Site profiles (under \\-\\-root), searched first; its README says how to "
                                 "write one. See proxytune\\-profile(5)."),
    ("~/.config/proxytune/profiles/", "The user's profiles, searched next."),
    ("/usr/share/proxytune/profiles/", "The shipped profiles; see proxytune profiles list."),
    ("/var/lib/proxytune/journal/", "The apply journal that rollback reads (root only, 0700); "
                                    "removed when the Debian package is purged."),
    ("/run/proxytune/", "The host\\-wide lock of apply and rollback (root's, 0700)."),
    ("/var/cache/proxytune/", "Built microbenchmark harnesses (root); removed with the Debian package."),
    ("/lib/systemd/system/proxytune.service, proxytune.timer",
     "(Debian package, not enabled) the audit every 15 minutes, written to "
     "/var/lib/prometheus/node\\-exporter/proxytune.prom for the node exporter's textfile collector."),
    ("/lib/systemd/system/proxytune\\-watch.service",
     "(Debian package, not enabled) proxytune watch: the doctor always on, its windows under "
     "/var/lib/proxytune/watch/."),
]

EXIT_STATUS = [("0", "All good."), ("1", "Drift or findings."), ("2", "Usage or runtime error."),
               ("3", "UNKNOWN, with \\-\\-format nagios only: proxytune itself failed."),
               ("130", "Interrupted.")]

SEE_ALSO_8 = ("proxytune\\-profile(5), tuned\\-adm(8), sysctl(8), sysctl.d(5), systemd.exec(5), "
              "limits.conf(5), prlimit(1), bpftrace(8), perf(1), valgrind(1), fio(1)")


def esc(text: str) -> str:
    """Roff-safe text: backslashes, minus signs, and a leading dot or quote."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line for line in text.split("\n"))


def paragraphs(help_text: str) -> list[str]:
    """click's help paragraphs: a \\b paragraph keeps its lines, the others are filled."""
    out = []
    for para in inspect.cleandoc(help_text or "").split("\n\n"):
        if para.startswith("\b\n"):
            out.append(".nf\n" + esc(para[2:]) + "\n.fi")
        elif para.strip():
            out.append(esc(" ".join(line.strip() for line in para.splitlines())))
    return out


def items(pairs) -> list[str]:
    """Tagged paragraphs; the pairs are roff already."""
    return sum(([".TP", f"\\fB{term}\\fR", text] for term, text in pairs), [])


def options(command: click.Command, ctx: click.Context) -> list[str]:
    records = (param.get_help_record(ctx) for param in command.get_params(ctx))
    return items((esc(r[0]), esc(r[1])) for r in records if r)


def commands(group: click.Group, ctx: click.Context) -> list[str]:
    out = []
    for name, sub in group.commands.items():
        sub_ctx = click.Context(sub, info_name=name, parent=ctx)
        usage = " ".join(sub.collect_usage_pieces(sub_ctx))
        out += [f'.SS "{esc(sub_ctx.command_path)} {esc(usage)}"', *sum(([p, ".PP"] for p in paragraphs(sub.help)), [])]
        out += options(sub, sub_ctx)
        if isinstance(sub, click.Group):
            out += commands(sub, sub_ctx)
    return out


def proxytune_8(main: click.Group, version: str) -> str:
    ctx = click.Context(main, info_name="proxytune")
    summary = main.help.split("\n", 1)[0].rstrip(".")
    lines = [f'.TH PROXYTUNE 8 "" "proxytune {version}" "System Administration"',
             ".SH NAME", f"proxytune \\- {esc(summary[0].lower() + summary[1:])}",
             ".SH SYNOPSIS", ".B proxytune", "[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR]...",
             ".SH DESCRIPTION", *sum(([p, ".PP"] for p in paragraphs(main.help)), []),
             ".SH GLOBAL OPTIONS", *options(main, ctx),
             ".SH COMMANDS", *commands(main, ctx),
             ".SH EXAMPLES", *items(EXAMPLES),
             ".SH ENVIRONMENT", *items(ENVIRONMENT),
             ".SH FILES", *items(FILES),
             ".SH EXIT STATUS", *items(EXIT_STATUS),
             ".SH SEE ALSO", SEE_ALSO_8]
    return "\n".join(lines) + "\n"


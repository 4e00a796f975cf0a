"""The two formats monitoring systems read: a Nagios/Icinga plugin line and a
node_exporter textfile (Prometheus text exposition format).

Why here and not in each command: the rules of both formats (states and their
exit codes, perfdata syntax, label escaping) are the consumers', the same for
`tune check` and `doctor`; the commands only say what to count.
"""

import re
import time

from .errors import CONTROL

# Monitoring Plugins development guidelines: the state is the exit code
OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
STATE_NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
PLUGIN = "PROXYTUNE"
PERF_LABEL = re.compile(r"[A-Za-z0-9_.\-]+")


def plugin_text(text: str) -> str:
    """Text for the status line: one line, and no '|' (it starts the perfdata)."""
    return re.sub(r"\s+", " ", CONTROL.sub(" ", str(text)).replace("|", "/")).strip()


def perf(label: str, value: int, warn: str = "", crit: str = "", low: int | None = 0,
         high: int | None = None) -> str:
    """One perfdata item, 'label=value[UOM];[warn];[crit];[min];[max]' (counts: no unit)."""
    if not PERF_LABEL.fullmatch(label):
        raise ValueError(f"perfdata label {label!r}")
    fields = [f"{label}={value}", warn, crit, "" if low is None else str(low), "" if high is None else str(high)]
    return ";".join(fields).rstrip(";")


def plugin_line(state: int, text: str, perfdata: list[str] = ()) -> str:
    """'PROXYTUNE STATE - text | perfdata': the one line Nagios and Icinga show and graph."""
    line = f"{PLUGIN} {STATE_NAMES[state]} - {plugin_text(text)}"
    return f"{line} | {' '.join(perfdata)}" if perfdata else line


def unknown_line(message: str) -> str:
    """An error of proxytune itself: the check could not decide, which is UNKNOWN, never CRITICAL."""
    return plugin_line(UNKNOWN, f"proxytune could not check: {message}")


def label_value(text) -> str:
    """A label value escaped as the exposition format says: backslash, double quote, line feed."""
    return str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def sample(name: str, labels: dict, value) -> str:
    inner = ",".join(f'{k}="{label_value(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {value}" if labels else f"{name} {value}"


class Metrics:
    """Metric families in the order they are declared: HELP and TYPE once, then the samples."""

    def __init__(self):
        self.families: dict[str, tuple[str, list[str], str]] = {}

    def add(self, name: str, help_text: str, labels: dict, value, kind: str = "gauge") -> None:
        """One sample; kind "counter" for a count that only grows while the writer runs (named *_total)."""
        self.families.setdefault(name, (help_text, [], kind))[1].append(sample(name, labels, value))

    def declare(self, name: str, help_text: str) -> None:
        """A family with possibly no samples (e.g. no findings): still named, so a rule can see it is empty."""
        self.families.setdefault(name, (help_text, [], "gauge"))

    def text(self) -> str:
        out = []
        for name, (help_text, samples, kind) in self.families.items():
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(out) + "\n"


def last_run(metrics: Metrics, command: str, profile: str) -> None:
    metrics.add("proxytune_last_run_timestamp_seconds", "When proxytune last wrote this file (Unix time).",
                {"command": command, "profile": profile}, f"{time.time():.3f}")

"""proxytune's CLI with a fault after an apply step, for the crash-safety tests only.

The product has no fault switch; this wrapper puts one into apply's `after_step` seam when
PROXYTUNE_FAULT_AFTER_STEP=N[:HOW] is set (N: after step N, 0 = right after the journal is
first written). HOW is kill (default, SIGKILL), stop (SIGSTOP, to hold the locks while a test
acts), int / term (Ctrl-C / SIGTERM), or bug (an unexpected exception). Without the variable
it is the plain CLI."""

import importlib.machinery
import importlib.util
import os
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if "proxytune" not in sys.modules:
    _spec = importlib.machinery.ModuleSpec("proxytune", None, is_package=True)
    _spec.submodule_search_locations = [str(REPO)]
    sys.modules["proxytune"] = importlib.util.module_from_spec(_spec)

from proxytune.tune import apply  # noqa: E402


class InjectedBug(RuntimeError):
    """The fault `bug` injects: stands for any unexpected exception."""


def fault(n: int) -> None:
    at, _, how = os.environ.get("PROXYTUNE_FAULT_AFTER_STEP", "").partition(":")
    if at != str(n):
        return
    if how == "bug":
        raise InjectedBug(f"injected fault after step {n}")
    sig = {"": signal.SIGKILL, "kill": signal.SIGKILL, "stop": signal.SIGSTOP,
           "int": signal.SIGINT, "term": signal.SIGTERM}[how]
    os.kill(os.getpid(), sig)


if __name__ == "__main__":
    apply.after_step = fault
    from proxytune.cli import run
    run()

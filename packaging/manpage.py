#!/usr/bin/env python3
"""Print a man page of the checkout (the .deb build installs them): section 8
is proxytune(8), generated from the CLI's own help; section 5 is
proxytune-profile(5). The same as `proxytune man [proxytune-profile]`.

    python3 packaging/manpage.py [8|5] > proxytune.8
"""

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = {"8": "proxytune", "5": "proxytune-profile"}


def load_cli():
    """The checkout as the `proxytune` package, as cli.py registers it when run."""
    sys.path.insert(0, str(REPO))
    if "proxytune" not in sys.modules:
        spec = importlib.machinery.ModuleSpec("proxytune", None, is_package=True)
        spec.submodule_search_locations = [str(REPO)]
        sys.modules["proxytune"] = importlib.util.module_from_spec(spec)
    from proxytune import cli
    return cli


def manpage(section: str = "8") -> str:
    cli = load_cli()
    from proxytune.commands.meta import man_page
    return man_page(PAGES[section], cli.main)


if __name__ == "__main__":
    sys.stdout.write(manpage(*sys.argv[1:2]))

#!/usr/bin/env python3
"""The Debian package of each proxy the registry knows (proxies/), one a line:
what the checkout's launcher installs for `bench proxy --proxy NAME`, and what
`make deps` installs for the tests. It loads the registry only (the standard
library and core/ below it), so it runs before the venv holds anything.

    python3 packaging/proxy-packages.py [NAME... | all]     (no name: every proxy)
"""

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    if "proxytune" not in sys.modules:          # the checkout is the `proxytune` package, as cli.py makes it
        spec = importlib.machinery.ModuleSpec("proxytune", None, is_package=True)
        spec.submodule_search_locations = [str(CHECKOUT)]
        sys.modules["proxytune"] = importlib.util.module_from_spec(spec)
    from proxytune import proxies
    print("\n".join(dict.fromkeys(proxies.packages(argv or ["all"]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

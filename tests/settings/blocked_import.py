"""``python -m tests.settings.blocked_import``: ``semel`` with some modules not installed.

The modules named in ``SEMEL_TEST_UNINSTALLED`` (comma-separated top-level
names) cannot be imported, as on a machine where the extra that brings them
was never installed; the rest of the command line is ``semel``'s.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType

UNINSTALLED_ENV = "SEMEL_TEST_UNINSTALLED"


class Uninstalled(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


if __name__ == "__main__":
    names = {n.strip() for n in os.environ.get(UNINSTALLED_ENV, "").split(",") if n.strip()}
    sys.meta_path.insert(0, Uninstalled(names))
    from semel.consumer.commands.app import main

    main()

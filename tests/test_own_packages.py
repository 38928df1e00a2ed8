"""A service's own top-level ``settings``, ``stores`` and ``consumer`` live beside semel's.

semel's packages are ``semel.consumer``, ``semel.stores`` and ``semel.settings``, so
a project with a ``settings.py`` or ``stores.py`` of its own (first on ``sys.path``,
as in the folder ``semel consume`` runs from) imports both, whichever comes first.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SERVICE = ("settings", "stores", "consumer")
# The service's handler imports its own modules...
OWN = """\
import consumer, settings, stores
assert {settings.OWNER, stores.OWNER, consumer.OWNER} == {"service"}
"""
# ...and semel imports every one of its own modules, none of them the service's.
SEMEL = """\
import importlib, pkgutil, semel
for info in pkgutil.walk_packages(semel.__path__, "semel."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
from semel.settings import Settings
from semel.consumer import Context, PermanentError
"""


@pytest.mark.parametrize("first", ["service", "semel"])
def test_a_service_with_its_own_settings_imports_both(tmp_path: Path, first: str) -> None:
    for name in SERVICE:
        (tmp_path / f"{name}.py").write_text("OWNER = 'service'\n")
    code = OWN + SEMEL if first == "service" else SEMEL + OWN
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr

"""The wheel built from the checkout and the fresh venv it is installed into, once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.install.fresh import Venv, built_wheel, fresh_venv, session_folder


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_wheel(session_folder(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Venv:
    return fresh_venv(session_folder(tmp_path_factory.getbasetemp()), wheel)

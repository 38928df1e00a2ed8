"""Store-suite fixtures.

``make_settings`` looks the backend up with ``request.getfixturevalue``, which
pytest cannot see when it checks a module-level ``parametrize("backend", ...)``
against each test's arguments; without a fixture of that name in every test's
closure, collection fails with "function uses no argument 'backend'".
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def backend(request: pytest.FixtureRequest) -> str | None:
    """The backend under test; a test's ``parametrize("backend", ...)`` overrides it."""
    name: str | None = getattr(request, "param", None)
    return name

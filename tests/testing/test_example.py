"""The README's example of the testing kit runs, and is the one in examples/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from examples.testing_handlers import test_charge as readme_example

pytestmark = pytest.mark.timeout(10)

ROOT = Path(__file__).parents[2]


async def test_the_readme_example_passes() -> None:
    await readme_example()


def test_the_readme_shows_the_example_that_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Testing your handlers") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    assert match.group(1) in (ROOT / "examples" / "testing_handlers.py").read_text()

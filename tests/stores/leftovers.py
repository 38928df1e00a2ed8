"""What of a store is still running: tasks running code of the ``semel.stores`` package."""

from __future__ import annotations

import asyncio
from pathlib import Path

from semel import stores

STORES = Path(stores.__file__).parent


def store_tasks(before: set[asyncio.Task[object]]) -> list[asyncio.Task[object]]:
    """Tasks not in ``before``, not ended, whose top runs code of the stores package
    (not the proxy's nor the test's own)."""
    return [t for t in asyncio.all_tasks() - before if not t.done() and _of_the_store(t)]


def _of_the_store(task: asyncio.Task[object]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and STORES in Path(code.co_filename).parents

"""A coroutine run in the background for as long as a container Resource is open."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any


@contextlib.asynccontextmanager
async def running(work: Coroutine[Any, Any, None] | None) -> AsyncIterator[None]:
    """Run ``work`` as a task (if any) inside the block; cancel it and wait on the way
    out, so what it uses (a store, the management API) can be closed after."""
    if work is None:
        yield None
        return
    task = asyncio.create_task(work)
    try:
        yield None
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

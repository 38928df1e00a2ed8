"""Reading the end state of a chaos run: the store's records and the broker's queues.

After the producer is done the run waits until every key is completed in the
store or dead-lettered, and the work, retry and conflict queues are empty;
the dead letters are taken out of ``Q.dlq`` as they arrive and kept.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Iterable

from semel.consumer.names import Topology
from semel.settings import Settings
from semel.stores.base import Record, Status, Store
from semel.stores.errors import StoreError
from tests.consumer.harness import Broker

STORE_CALL_LIMIT = 3.0  # seconds the orchestrator waits for one store read
READ_CONCURRENCY = 16


async def _bounded(store_call: Awaitable[Record | None]) -> Record | None:
    return await asyncio.wait_for(store_call, STORE_CALL_LIMIT)


async def statuses(store: Store, keys: Iterable[str]) -> dict[str, Status | None]:
    """Each key's status in the store; a key whose read fails counts as unknown (None)."""
    limit = asyncio.Semaphore(READ_CONCURRENCY)

    async def one(key: str) -> tuple[str, Status | None]:
        async with limit:
            try:
                record = await _bounded(store.get(key))
            except (StoreError, TimeoutError):
                return key, None
            return key, None if record is None else record.status

    return dict(await asyncio.gather(*(one(k) for k in keys)))


class Drain:
    """Waits until every key is settled, reading the DLQ and the store as it goes."""

    def __init__(self, observer: Broker, store: Store, settings: Settings, keys: list[str]) -> None:
        self.observer, self.store, self.settings = observer, store, settings
        self.keys = keys
        self.dead: dict[str, set[str]] = defaultdict(set)
        self.dlq_messages = 0
        self.completed: set[str] = set()

    async def read_dlq(self) -> None:
        for letter in await self.observer.dead_letters(self.settings):
            self.dead[letter.key].add(letter.reason)
            self.dlq_messages += 1

    async def busy(self) -> int:
        """Messages waiting in the work, retry and conflict queues."""
        dlq = Topology(self.settings.queue).dead_letter_queue
        depths = await self.observer.depths(self.settings)
        return sum(depth for name, depth in depths.items() if name != dlq)

    async def until_settled(self, deadline: float) -> bool:
        end = time.monotonic() + deadline
        pending = set(self.keys)
        while True:
            await self.read_dlq()
            pending -= self.dead.keys()
            found = await statuses(self.store, pending)
            pending -= {k for k, status in found.items() if status is Status.COMPLETED}
            if not pending and await self.busy() == 0:
                return True
            if time.monotonic() > end:
                return False
            await asyncio.sleep(0.5)

    async def final(self) -> None:
        await self.read_dlq()
        found = await statuses(self.store, self.keys)
        self.completed = {k for k, status in found.items() if status is Status.COMPLETED}

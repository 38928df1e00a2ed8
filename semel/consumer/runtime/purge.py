"""Retention: deleting keys past it and outbox messages sent longer ago than it.

``semel purge`` (:mod:`semel.consumer.commands.store`) deletes everything due, in
batches. Every consumer also purges in the background (PostgreSQL, SQLite,
transactional mode): a bounded amount every few minutes, at an offset chosen
at random so processes started together do not purge together. Two that do
are harmless: on PostgreSQL each batch skips the rows another one locked and
checks expiry again as it deletes, on SQLite the write lock takes one
statement at a time. Batches are small and each is its own short statement,
so a claim never waits long behind one. Redis and DynamoDB expire keys by
themselves, so there is nothing to purge.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

import structlog

from semel.consumer.tasks import running
from semel.stores.base import Store
from semel.stores.errors import StoreError

PURGE_INTERVAL = 300.0  # seconds between background purges, at most
BATCH = 1_000  # rows per DELETE, so no statement holds many locks for long
BACKGROUND_BATCHES = 10  # DELETEs of each kind per background purge
BACKGROUND_BATCH = 500  # rows per background DELETE: short beside the claims it runs among

log = structlog.get_logger("semel.purge")


@runtime_checkable
class PurgesKeys(Protocol):
    async def purge(self, limit: int = ...) -> int: ...


@runtime_checkable
class PurgesOutbox(Protocol):
    async def purge_outbox(self, limit: int = ...) -> int: ...

    async def unsent(self) -> int: ...


@dataclass(frozen=True, slots=True)
class PurgeReport:
    """What one purge deleted; ``None`` where the store has nothing of the kind."""

    keys: int | None
    messages: int | None
    unsent: int | None  # outbox messages still waiting for the relay

    def summary(self, backend: str) -> str:
        if self.keys is None:
            return f"nothing to purge: the {backend} store expires keys by itself"
        text = f"purged {self.keys} expired keys"
        if self.messages is not None:
            text += f" and {self.messages} sent outbox messages; {self.unsent} wait for the relay"
        return text


async def _batches(target: PurgesKeys, batch: int, most: int | None) -> int:
    total = done = 0
    while most is None or done < most:
        deleted = await target.purge(batch)
        total, done = total + deleted, done + 1
        if deleted < batch:
            break
    return total


class _OutboxBatches:
    def __init__(self, store: PurgesOutbox) -> None:
        self._store = store

    async def purge(self, limit: int = BATCH) -> int:
        return await self._store.purge_outbox(limit)


async def purge(store: Store, *, batch: int = BATCH, most: int | None = None) -> PurgeReport:
    """Delete what is due, ``batch`` rows at a time; at most ``most`` batches of each kind."""
    if not isinstance(store, PurgesKeys):
        return PurgeReport(None, None, None)
    keys = await _batches(store, batch, most)
    if not isinstance(store, PurgesOutbox):
        return PurgeReport(keys, None, None)
    messages = await _batches(_OutboxBatches(store), batch, most)
    return PurgeReport(keys, messages, await store.unsent())


async def purge_periodically(
    store: Store,
    interval: float,
    purged: Callable[[int], None] | None = None,
    *,
    batch: int = BACKGROUND_BATCH,
) -> None:
    """Purge a bounded amount every ``interval`` seconds until cancelled; ``purged``
    is told how many keys each round deleted."""
    await asyncio.sleep(random.uniform(0, interval))
    while True:
        try:
            report = await purge(store, batch=batch, most=BACKGROUND_BATCHES)
        except StoreError as exc:  # unreachable or not set up: the next round tries again
            log.warning("purge skipped", error=str(exc))
        else:
            if purged is not None and report.keys:
                purged(report.keys)
            if report.keys or report.messages:
                log.info("purged", **asdict(report))
        await asyncio.sleep(interval)


async def background_purge(
    store: Store, interval: float, purged: Callable[[int], None], enabled: bool = True
) -> AsyncIterator[None]:
    """The container's Resource: purge ``store`` in the background while the consumer
    runs, if it keeps keys that need it; stopped before the store closes."""
    work = None
    if enabled and isinstance(store, PurgesKeys):
        work = purge_periodically(store, interval, purged)
    async with running(work):
        yield None

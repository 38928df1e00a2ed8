"""A running relay and what goes with it: its listener, its purge, its watch.

:func:`running_relay` is what ``semel relay``, ``engine.relay()``, ``semel
consume`` (with ``SEMEL_OUTBOX_RELAY=true``) and transactional mode's worker
all run: the outbox table is checked first (a missing table stops start-up),
then, until the block ends,

- the relay (:class:`semel.consumer.outbox.relay.Relay`), woken by the
  listener and sweeping every ``RelayOptions.sweep`` seconds;
- the listener (:class:`semel.consumer.outbox.listener.Listener`), unless
  ``listen`` is off;
- the purge of rows sent longer ago than the source's retention, a bounded
  amount every ``purge_interval`` seconds (``None``: the caller purges);
- ``watch``, any periodic check of the outbox (gauges of unsent rows, say),
  called every ``watch_interval`` seconds with the source.

On the way out the relay finishes its pass and sends what is left within a
bound; the others are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog
from aio_pika.abc import AbstractConnection

from semel.consumer.names import BROKER_CALL_TIMEOUT
from semel.consumer.outbox.listener import Listener
from semel.consumer.outbox.relay import BATCH, POLL_INTERVAL, Relay
from semel.consumer.outbox.source import OutboxSource
from semel.consumer.stopping import UNWIND, within
from semel.stores.errors import StoreError
from semel.stores.postgres.outbox import Ordering

PURGE_BATCH = 500  # rows per DELETE: short beside the inserts it runs among
PURGE_BATCHES = 10  # DELETEs per round at most

log = structlog.get_logger("semel.outbox")

Watch = Callable[[OutboxSource], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RelayOptions:
    """How a relay runs: plain values, read from the settings by the composition root."""

    table: str  # also the NOTIFY channel
    dsn: str | None = None  # where to LISTEN; None: no listener (the sweep only)
    ordering: Ordering = Ordering.OLDEST_FIRST
    sweep: float = POLL_INTERVAL  # seconds between passes nothing woke
    batch: int = BATCH
    purge_interval: float | None = 300.0
    watch_interval: float = 15.0


@dataclass(frozen=True, slots=True)
class RunningRelay:
    """What :func:`running_relay` gives its block."""

    relay: Relay
    listener: Listener | None


@contextlib.asynccontextmanager
async def running_relay(
    source: OutboxSource,
    connection: AbstractConnection,
    options: RelayOptions,
    watch: Watch | None = None,
) -> AsyncIterator[RunningRelay]:
    """Run a relay from ``source`` to ``connection`` for the block's duration.

    Raises :class:`semel.stores.errors.StoreMisconfigured` before anything
    starts when the outbox table does not exist.
    """
    await source.check_schema()
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    relay = Relay(
        source, channel, batch=options.batch, poll=options.sweep, ordering=options.ordering
    )
    listener = None
    helpers: list[Coroutine[Any, Any, None]] = []
    if options.dsn is not None:
        listener = Listener(options.dsn, options.table, source.commits)
        helpers.append(listener.run())
    if options.purge_interval is not None:
        helpers.append(_purge_periodically(source, options.purge_interval))
    if watch is not None:
        helpers.append(_every(options.watch_interval, lambda: watch(source)))
    tasks = [asyncio.create_task(helper) for helper in helpers]
    relaying = asyncio.create_task(relay.run())
    try:
        yield RunningRelay(relay, listener)
    finally:
        await relay.stop(relaying)
        for task in tasks:
            task.cancel()
        await within(UNWIND, "the outbox listener, purge and watch", _ended(tasks))
        with contextlib.suppress(Exception):
            await within(BROKER_CALL_TIMEOUT, "closing the relay's channel", channel.close())


async def _ended(tasks: list[asyncio.Task[None]]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)


async def _purge_periodically(source: OutboxSource, interval: float) -> None:
    """Delete sent rows past retention, a bounded amount per round, until cancelled.

    The first round comes at a random offset, so relays started together do
    not purge together (two that do are harmless: each DELETE skips the rows
    another one locked).
    """
    await asyncio.sleep(random.uniform(0, interval))
    while True:
        deleted = 0
        try:
            for _ in range(PURGE_BATCHES):
                batch = await source.purge_outbox(PURGE_BATCH)
                deleted += batch
                if batch < PURGE_BATCH:
                    break
        except StoreError as exc:  # unreachable for now: the next round tries again
            log.warning("outbox purge skipped", error=str(exc))
        if deleted:
            log.info("purged sent outbox messages", messages=deleted)
        await asyncio.sleep(interval)


async def _every(interval: float, call: Callable[[], Awaitable[None]]) -> None:
    """``call`` now and every ``interval`` seconds until cancelled; a failure is logged."""
    while True:
        try:
            await call()
        except Exception:  # a watch must never stop the relay
            log.exception("outbox watch failed")
        await asyncio.sleep(interval)

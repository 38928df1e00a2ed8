"""The composition of the outbox: which relay runs where, on what, from the settings.

Part of the composition root, beside :mod:`semel.consumer.container` (which
provides the writer and the watch from here): the modules below read plain
values only. Everything that needs psycopg is imported when a relay or the
outbox table is first wanted, so a worker on another store never loads it.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import Any

from semel.consumer.delivery.message import KeySource
from semel.consumer.errors import ConfigurationError
from semel.consumer.ops.metrics import Metrics
from semel.consumer.ops.outbox_watch import OutboxWatch
from semel.consumer.outbox.writer import OutboxWriter
from semel.consumer.plan import purge_interval
from semel.settings import Settings
from semel.stores.base import Store


def outbox_writer(settings: Settings) -> OutboxWriter:
    """The writer that stages messages in a caller's transaction (no connection of its own)."""
    return OutboxWriter(
        settings.outbox_table, settings.exchange, KeySource.parse(settings.key_source)
    )


def outbox_watch_of(settings: Settings, metrics: Metrics) -> OutboxWatch:
    """What a running relay calls every few seconds: the outbox gauges and /readyz detail."""
    status = _outbox_module("semel.stores.postgres.outbox_status")
    look = status.summary_reader(
        status.connecting(settings.postgres_dsn), settings.outbox_table, settings.outbox_stale_after
    )
    return OutboxWatch(look, metrics.outbox_gauges())


def relays_in_consumer(settings: Settings) -> bool:
    """Whether ``semel consume`` runs a relay: always in transactional mode, else on request."""
    return settings.transactional or settings.outbox_relay


def migrates_outbox(settings: Settings) -> bool:
    """Whether ``semel migrate`` makes the outbox table beside the store's own.

    Wherever semel has a PostgreSQL database: with the PostgreSQL store
    (transactional mode's store makes it itself), or when a relay is asked for
    with another store (the outbox then lives at ``SEMEL_POSTGRES_DSN``).
    """
    return not settings.transactional and (
        settings.store.value == "postgres" or settings.outbox_relay
    )


def _outbox_module(name: str) -> Any:
    """A module of the relay, which needs psycopg: a missing extra is a configuration error."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("semel"):
            raise
        raise ConfigurationError(
            f"the outbox relay needs the 'postgres' extra, not installed here "
            f"(no module {exc.name!r}): pip install 'semel[postgres]'"
        ) from None


async def open_outbox(settings: Settings) -> Any:
    """The outbox table on a small pool of its own (a ``PostgresOutbox``); close it after."""
    source = _outbox_module("semel.consumer.outbox.source")
    return await source.open_outbox(
        dsn=settings.postgres_dsn,
        table=settings.outbox_table,
        retention=settings.retention,
        deadline=settings.lock_ttl / 3,  # as the store's calls: a hung pass is cut short
    )


def relay_options(settings: Settings, *, purge: bool = True) -> Any:
    """The ``RelayOptions`` the settings ask for; ``purge`` false when the caller
    purges the outbox already (transactional mode's worker)."""
    runner = _outbox_module("semel.consumer.outbox.runner")
    ordering = _outbox_module("semel.stores.postgres.outbox").Ordering
    return runner.RelayOptions(
        table=settings.outbox_table,
        dsn=settings.postgres_dsn if settings.outbox_listen else None,
        ordering=ordering(settings.outbox_ordering.value),
        purge_interval=purge_interval(settings) if purge else None,
    )


@contextlib.asynccontextmanager
async def relaying(
    settings: Settings, connection: Any, store: Store | None = None, watch: Any = None
) -> AsyncIterator[Any]:
    """Run this process's outbox relay for the block (a ``RunningRelay``).

    In transactional mode pass the consumer's ``store``: the relay then reads
    through its pool and wakes on its commits at once, and its worker purges.
    Otherwise the relay opens the outbox table itself. ``watch`` is called
    periodically with the outbox (``semel.consumer.outbox.runner.Watch``).
    Raises ``StoreMisconfigured`` (exit 2) when the outbox table is missing.
    """
    runner = _outbox_module("semel.consumer.outbox.runner")
    if store is not None:
        units = importlib.import_module("semel.consumer.transactional.worker")
        source = units.transactional_store(store)
        async with runner.running_relay(
            source, connection, relay_options(settings, purge=False), watch
        ) as running:
            yield running
        return
    source = await open_outbox(settings)
    try:
        async with runner.running_relay(
            source, connection, relay_options(settings), watch
        ) as running:
            yield running
    finally:
        await source.close()

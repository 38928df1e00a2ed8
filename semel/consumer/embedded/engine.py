"""``Semel``: semel's engine inside a service's own code.

One object per process, built from a :class:`semel.settings.Settings` given in
code or read from the environment (``SEMEL_*``, as the worker reads it). It
opens the store and a broker connection of its own (for the confirmed retry
copies and dead letters, and to return what waits in the delay queues) and
gives the front doors their queues: :meth:`Semel.process` for an aio-pika
callback, :meth:`Semel.faststream` for a FastStream broker or router, and
:meth:`Semel.idempotent` for any async function (no broker needed then:
only the store is opened). :attr:`Semel.outbox` stages messages in the
application's own PostgreSQL transactions and :meth:`Semel.relay` publishes
them from this process; neither needs :meth:`Semel.start`.
Everything runs through the composition root, like ``semel consume``: the
same store wrappers (deadline, batching, metrics), pipeline and settler.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

import structlog
from dependency_injector import providers

from semel.consumer.broker.connection import through_drops
from semel.consumer.broker.delays import DelayReturns
from semel.consumer.broker.topology import declare
from semel.consumer.container import Container, checked_settings, shutdown
from semel.consumer.delivery.message import Incoming
from semel.consumer.delivery.pipeline import Pipeline
from semel.consumer.delivery.routes import Routes
from semel.consumer.embedded.door import DeferringSettler, Door, Witness, through
from semel.consumer.embedded.scope import Scope
from semel.consumer.errors import ConfigurationError
from semel.consumer.idempotent import idempotent
from semel.consumer.names import Topology
from semel.consumer.ops.logs import configure
from semel.consumer.ops.metrics import Metrics, MetricsObserver
from semel.consumer.ops.tracing import traced
from semel.consumer.outbox.writer import OutboxWriter
from semel.consumer.outboxes import relaying
from semel.consumer.plan import message_rules, pipeline_config, retry_policy, topology_of
from semel.settings import ConfigError, Settings, derived
from semel.stores.base import Store

P = ParamSpec("P")
R = TypeVar("R")


class Semel:
    """semel for a consumer that is not semel's worker.

    ``Semel()`` reads the environment; ``Semel(Settings(store="redis", ...))``
    or ``Semel(store="redis", ...)`` takes settings in code. Use it as
    ``async with Semel(...) as semel:``, or call :meth:`start` and :meth:`close`
    from the application's start-up and shutdown hooks.
    """

    def __init__(self, settings: Settings | None = None, /, **overrides: Any) -> None:
        try:
            if settings is None:
                settings = checked_settings(**overrides)
            elif overrides:
                settings = derived(settings, **overrides)
        except ConfigError as exc:
            raise ConfigurationError(str(exc)) from None
        if settings.transactional:
            # Its handler writes in the key's own transaction, which the worker
            # opens; a front door runs code semel does not call that way.
            raise ConfigurationError(
                "SEMEL_TRANSACTIONAL: transactional mode runs in `semel consume` only"
            )
        self.settings = settings
        self._container = Container()
        self._container.settings.override(providers.Object(settings))
        self._store: Store | None = None
        self._doors: dict[str, Door] = {}
        # A decorated function's own expiry is a store of its own retention.
        self._kept: dict[float, tuple[Container, Store]] = {}
        self._locks()

    def _locks(self) -> None:
        # Made again at close: a lock once waited on belongs to that event loop.
        self._opening = asyncio.Lock()
        self._started = asyncio.Lock()

    @property
    def metrics(self) -> Metrics:
        """semel's metrics; ``metrics.registry`` can be served by the application."""
        metrics: Metrics = self._container.metrics()
        return metrics

    @property
    def outbox(self) -> OutboxWriter:
        """Stages messages in the application's own transaction (``await
        engine.outbox.stage(conn, body, key=..., routing_key=...)``); see docs/outbox.md."""
        writer: OutboxWriter = self._container.outbox()
        return writer

    @contextlib.asynccontextmanager
    async def relay(self) -> AsyncIterator[Any]:
        """``async with engine.relay():`` runs an outbox relay in this process (a
        web app's lifespan, say): it publishes what any process staged, woken by
        LISTEN/NOTIFY, sweeping the table, purging sent rows. It has its own
        broker connection and database pool, closed when the block ends.
        Raises :class:`semel.stores.errors.StoreMisconfigured` when the outbox
        table is missing (run ``semel migrate``)."""
        self._configure_logs()
        container = Container()
        container.settings.override(providers.Object(self.settings))
        try:
            connection = await container.connection.async_()
            async with relaying(
                self.settings, connection, watch=self._container.outbox_watch()
            ) as running:
                yield running
        finally:
            await shutdown(container)

    def _configure_logs(self) -> None:
        if not structlog.is_configured():
            # semel's lines in SEMEL_LOG_FORMAT at SEMEL_LOG_LEVEL, unless the
            # application configured structlog itself; its logging stays its own.
            configure(self._container.logs(), stdlib=False)

    async def start(self) -> Semel:
        """Open the store (a bad setting or an unreachable store raises here)."""
        async with self._started:
            self._configure_logs()
            if self._store is None:
                self._store = await _opened(self._container)
        return self

    async def store(self) -> Store:
        """The store every front door claims in (opened on first use)."""
        if self._store is None:
            await self.start()
        assert self._store is not None
        return self._store

    async def store_for(self, retention: float | None) -> Store:
        """The store that keeps completed keys for ``retention`` seconds (``None``:
        ``SEMEL_RETENTION``), opened the first time it is asked for."""
        if retention is None or retention == self.settings.retention:
            return await self.store()
        async with self._opening:
            if (kept := self._kept.get(retention)) is None:
                # Not checked against the retry chain, as derived() would: a
                # function's keys are not redelivered, only called again.
                settings = self.settings.model_copy(update={"retention": retention})
                container = Container()
                container.settings.override(providers.Object(settings))
                kept = self._kept[retention] = (container, await _opened(container))
        return kept[1]

    def idempotent(
        self, **options: Any
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
        """``@engine.idempotent(key="order_id", ...)``: an ``async def`` run
        effectively once per key in this engine's store (the options are
        :func:`semel.consumer.idempotent.idempotent`'s; see docs/idempotent.md)."""
        return idempotent(self.store_for, **options)

    async def door(self, queue: str | None = None) -> Door:
        """``queue``'s door (default ``SEMEL_QUEUE``), its delay queues and DLQ declared
        beside it and their consumers started the first time it is asked for."""
        name = queue or self.settings.queue
        if (door := self._doors.get(name)) is not None:
            return door
        async with self._opening:
            if (door := self._doors.get(name)) is None:
                door = self._doors[name] = await self._open_door(name)
        return door

    def opened(self, queue: str) -> Door | None:
        """``queue``'s door if it is open already."""
        return self._doors.get(queue)

    async def _open_door(self, queue: str) -> Door:
        try:
            settings = derived(self.settings, queue=queue)
        except ConfigError as exc:
            raise ConfigurationError(str(exc)) from None
        store = await self.store()
        container = self._container
        connection = await container.connection.async_()
        topology = topology_of(settings)
        give_up = settings.broker_give_up

        async def declared() -> None:
            await declare(connection, topology, work_queue=False)

        await through_drops(declared, connection, give_up)
        publishing = await connection.channel(publisher_confirms=True, on_return_raises=True)
        settler = await DeferringSettler.open(publishing, Topology(queue))
        routes = Routes.single(
            through, message_rules(settings), retry_policy(settings), settings.handler_timeout
        )
        pipeline = Pipeline(
            store=store,
            routes=routes,
            settler=settler,
            config=pipeline_config(settings),
            observer=Witness(traced(MetricsObserver(self.metrics), queue)),
        )

        async def delays() -> DelayReturns:
            return await DelayReturns.start(connection, topology)

        return Door(pipeline, settler, await through_drops(delays, connection, give_up))

    def process(self, message: Incoming, *, queue: str | None = None) -> Scope:
        """``async with semel.process(message) as run:`` in an aio-pika callback
        (see :class:`semel.consumer.embedded.scope.Scope`)."""
        return Scope(self, message, queue)

    def faststream(self) -> Any:
        """A middleware for a FastStream ``RabbitBroker`` or ``RabbitRouter``:
        ``RabbitBroker(url, middlewares=[semel.faststream()])``. FastStream is
        imported here, on first use: only an app that uses it needs it."""
        from semel.consumer.embedded.faststream import middleware

        return middleware(self)

    async def close(self) -> None:
        """Stop the delay consumers, close the store and the connection."""
        doors, self._doors = list(self._doors.values()), {}
        for door in doors:
            await door.close(self.settings.shutdown_grace)
        kept, self._kept = list(self._kept.values()), {}
        for container, _ in kept:
            await shutdown(container)
        self._store = None
        await shutdown(self._container)
        # Started again (a test's next event loop, say), the store is opened
        # anew: the metered wrapper must not hold on to the closed one.
        self._container.metered_store.reset()
        self._locks()

    async def __aenter__(self) -> Semel:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def _opened(container: Container) -> Store:
    """``container``'s store behind the worker's wrappers (a deadline on every call,
    batching, metrics), its background purge started."""
    store = container.store()
    if inspect.isawaitable(store):
        await store
    metered: Any = container.metered_store()
    if inspect.isawaitable(metered):
        metered = await metered
    await container.purger.async_()
    opened: Store = metered
    return opened

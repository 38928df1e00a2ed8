"""``Semel``: semel's engine inside a service's own code.

One object per process, built from a :class:`semel.settings.Settings` given in
code or read from the environment (``SEMEL_*``, as the worker reads it). It
opens the store and a broker connection of its own (for the confirmed retry
copies and dead letters, and to return what waits in the delay queues) and
gives the front doors their queues: :meth:`Semel.process` for an aio-pika
callback, :meth:`Semel.faststream` for a FastStream broker or router.
Everything runs through the composition root, like ``semel consume``: the
same store wrappers (deadline, batching, metrics), pipeline and settler.
"""

from __future__ import annotations

import asyncio
import inspect
from types import TracebackType
from typing import Any

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
from semel.consumer.names import Topology
from semel.consumer.ops.logs import configure
from semel.consumer.ops.metrics import Metrics, MetricsObserver
from semel.consumer.ops.tracing import traced
from semel.consumer.plan import message_rules, pipeline_config, retry_policy, topology_of
from semel.settings import ConfigError, Settings, derived
from semel.stores.base import Store


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
        self._opening = asyncio.Lock()
        self._started = asyncio.Lock()

    @property
    def metrics(self) -> Metrics:
        """semel's metrics; ``metrics.registry`` can be served by the application."""
        metrics: Metrics = self._container.metrics()
        return metrics

    async def start(self) -> Semel:
        """Open the store (a bad setting or an unreachable store raises here)."""
        async with self._started:
            if not structlog.is_configured():
                # semel's lines in SEMEL_LOG_FORMAT at SEMEL_LOG_LEVEL, unless the
                # application configured structlog itself; its logging stays its own.
                configure(self._container.logs(), stdlib=False)
            if self._store is None:
                store = self._container.store()
                if inspect.isawaitable(store):
                    await store
                metered: Any = self._container.metered_store()
                if inspect.isawaitable(metered):
                    metered = await metered
                await self._container.purger.async_()
                self._store = metered
        return self

    async def store(self) -> Store:
        """The store every front door claims in (opened on first use)."""
        if self._store is None:
            await self.start()
        assert self._store is not None
        return self._store

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
        names = Topology(queue)
        settler = DeferringSettler(
            await publishing.get_exchange(names.retry_exchange, ensure=False),
            await publishing.get_exchange(names.dead_letter_exchange, ensure=False),
            names,
        )
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
            await door.close()
        self._store = None
        await shutdown(self._container)

    async def __aenter__(self) -> Semel:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

"""Transactional mode (``SEMEL_TRANSACTIONAL=true``): the handler's writes, its
key's completion and its outgoing messages commit in one PostgreSQL transaction.

The delivery pipeline is the ordinary one; only two collaborators differ. The
handler is wrapped so that it runs inside a unit of work
(:meth:`semel.stores.postgres.transactional.TransactionalStore.run_unit`) and sees the
transaction as ``context.db``; the unit commits before the pipeline acks, and
the store then answers the pipeline's completion from that commit. The worker
also runs the background purge (keys and sent outbox rows); the process's
outbox relay runs beside the workers (:func:`semel.consumer.outboxes.relaying`).

What this mode guarantees: effects on the same PostgreSQL database happen once
per key, and every staged message is published at least once, with a stable
message id. Effects anywhere else (an HTTP call, an e-mail) are still only
"at most one worker at a time", as in the ordinary mode.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, fields
from typing import Any

import structlog
from aio_pika.abc import AbstractRobustConnection
from psycopg import AsyncConnection

from semel.consumer.delivery.handler import Context, Handler, is_async
from semel.consumer.delivery.results import storable
from semel.consumer.delivery.routes import Routes
from semel.consumer.errors import HandlerLoadError, LeaseLost
from semel.consumer.runtime.purge import purge_periodically
from semel.consumer.runtime.worker import Worker
from semel.stores.base import JSON, Store
from semel.stores.errors import FencedOut
from semel.stores.postgres.outbox import Outbox
from semel.stores.postgres.transactional import TransactionalStore

log = structlog.get_logger("semel.transactional")


@dataclass(frozen=True, slots=True, kw_only=True)  # whatever defaults Context's fields have
class TransactionalContext(Context):
    """The handler's context, plus its open transaction and its outbox.

    ``db`` is a psycopg ``AsyncConnection`` inside a transaction that semel
    commits after the handler returned (or rolls back if it raised): never
    commit or roll back yourself (psycopg refuses inside the block); use
    ``db.transaction()`` for a savepoint.
    """

    db: AsyncConnection[Any]
    outbox: Outbox

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: JSON | bytes,
        headers: dict[str, Any] | None = None,
        *,
        content_type: str | None = None,
    ) -> str:
        """Stage a message, published once the transaction has committed; returns its id.

        Bytes are sent as they are; anything else as JSON. ``exchange`` ``""``
        is the default exchange (``routing_key`` is then a queue name).
        """
        return self.outbox.stage(exchange, routing_key, body, headers, content_type)


class TransactionalHandler:
    """Runs the user's handler inside its key's unit of work."""

    def __init__(self, handler: Handler, store: TransactionalStore, scope: str = "") -> None:
        if not is_async(handler):
            # The transaction's connection belongs to the event loop; a plain
            # function would run on a thread of its own and could not use it.
            raise HandlerLoadError("SEMEL_TRANSACTIONAL: the handler must be an async function")
        self._handler = handler
        self.__wrapped__ = handler  # the pipeline finds a typed handler's body type through it
        self._store = store
        self._scope = scope  # an app handler's keys are kept under its name

    async def __call__(self, context: Context) -> Any:
        async def work(conn: AsyncConnection[Any], outbox: Outbox) -> JSON:
            values = {field.name: getattr(context, field.name) for field in fields(context)}
            result = await self._handler(TransactionalContext(**values, db=conn, outbox=outbox))
            # Encoded before the commit, once: what cannot be kept is stored as
            # null, never a reason to roll back work that succeeded.
            return storable(self._store, context.key, result)

        try:
            return await self._store.run_unit(self._scope + context.key, context.fence, work)
        except FencedOut as exc:
            # Nothing was committed; the worker that took the key over decides.
            raise LeaseLost(str(exc)) from None


def transactional_store(store: Store) -> TransactionalStore:
    """The transactional store behind ``store`` and any wrapper around it (metrics)."""
    found: Store = store
    while not isinstance(found, TransactionalStore):
        inner = getattr(found, "inner", None)
        if not isinstance(inner, Store):
            raise TypeError(f"transactional mode needs the PostgreSQL store, not {store.backend}")
        found = inner
    return found


class TransactionalWorker(Worker):
    """The worker, with handlers in transactions and the purge."""

    def __init__(
        self,
        connection: AbstractRobustConnection,
        store: Store,
        routes: Routes,
        **collaborators: Any,
    ) -> None:
        units = transactional_store(store)
        wrapped = routes.mapped(
            lambda route: TransactionalHandler(route.handler, units, route.scope)
        )
        super().__init__(connection, store, wrapped, **collaborators)
        self._units = units

    async def run(self, stop: asyncio.Event) -> int:
        await self._units.check_schema()
        purging = asyncio.create_task(purge_periodically(self._units, self._config.purge_interval))
        try:
            return await super().run(stop)
        finally:
            purging.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await purging

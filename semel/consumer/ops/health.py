"""What ``/healthz`` and ``/readyz`` answer.

Alive is the process answering at all. Ready is: the broker connection is
open, and the store answered within the last few seconds. Readiness also
names the broker node the connection is on (``host:port``), which changes
when the worker moves to another node of a cluster, and, where a relay runs,
the outbox watch's detail (shown, never a reason to be unready). Every store call
of the worker counts as an answer (see :class:`semel.consumer.ops.metered.Pulse`), so
the store is pinged only when it has been quiet for ``PING_INTERVAL``, each
ping bounded by ``PING_TIMEOUT``. Readiness therefore turns false within
about ``PING_INTERVAL + PING_TIMEOUT`` of an outage, and true again at the
first answer after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog
from aio_pika.abc import AbstractConnection

from semel.consumer.broker.connection import ClusterConnection
from semel.consumer.ops.metered import MeteredStore
from semel.stores.errors import StoreUnavailable

PING_INTERVAL = 2.0  # seconds of store silence before a ping
PING_TIMEOUT = 2.0  # seconds a ping may take before the store counts as down
_SLACK = 1.0  # seconds of scheduling delay tolerated before an answer is stale

log = structlog.get_logger("semel.health")


class Health:
    """Readiness of one consumer: its broker connection and its store."""

    def __init__(
        self, *, ping_interval: float = PING_INTERVAL, ping_timeout: float = PING_TIMEOUT
    ) -> None:
        self._interval = ping_interval
        self._timeout = ping_timeout
        self._connection: AbstractConnection | None = None
        self._store: MeteredStore | None = None
        self._pinger: asyncio.Task[None] | None = None
        self._outbox: Callable[[], str] | None = None
        self._needs_store = True

    # Readiness follows start-up: nothing is ready until it has been handed over.
    def watch_broker(self, connection: AbstractConnection) -> None:
        self._connection = connection

    def watch_store(self, store: MeteredStore) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
        self._store = store
        self._pinger = asyncio.create_task(self._ping_when_quiet(store))

    def without_store(self) -> None:
        """A process that holds no store (``semel relay``): ready is the broker alone."""
        self._needs_store = False

    def watch_outbox(self, detail: Callable[[], str]) -> None:
        """Show ``detail`` (the outbox watch's) in ``/readyz``, where a relay runs."""
        self._outbox = detail

    def outbox(self) -> str | None:
        """The outbox watch's detail; ``None`` where no relay runs. It never makes the
        process unready (:mod:`semel.consumer.ops.outbox_watch` says why)."""
        return None if self._outbox is None else self._outbox()

    def readiness(self) -> dict[str, bool]:
        """``{"broker": up, "store": up}`` (no store where none is held)."""
        if not self._needs_store:
            return {"broker": self._broker_up()}
        return {"broker": self._broker_up(), "store": self._store_up()}

    def stopped_for(self) -> str | None:
        """Why consumption stopped until a restart; None while it runs (or may resume)."""
        return None if self._store is None else self._store.stopped_for

    def broker_node(self) -> str | None:
        """``host:port`` of the broker node connected to; None while the broker is down."""
        connection = self._connection
        if not isinstance(connection, ClusterConnection) or not self._broker_up():
            return None
        return connection.node

    def _broker_up(self) -> bool:
        connection = self._connection
        return connection is not None and not connection.is_closed and connection.connected.is_set()

    def _store_up(self) -> bool:
        if self._store is None:
            return False
        pulse = self._store.pulse
        return pulse.up and time.monotonic() - pulse.at <= self._interval + self._timeout + _SLACK

    async def _ping_when_quiet(self, store: MeteredStore) -> None:
        while True:
            quiet = time.monotonic() - store.pulse.at
            if quiet >= self._interval:
                await self._ping(store)
                quiet = 0.0
            await asyncio.sleep(self._interval - quiet)

    async def _ping(self, store: MeteredStore) -> None:
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
            # cancellation that arrives as the ping answers, and the pinger
            # would outlive close() (which then waited for it forever).
            async with asyncio.timeout(self._timeout):
                await store.ping()
        except StoreUnavailable:
            pass  # the store's pulse has recorded it
        except Exception as exc:  # no answer in time, or a store closing under us
            store.pulse.beat(up=False)
            log.debug("store ping failed", error=repr(exc))

    async def close(self) -> None:
        pinger, self._pinger = self._pinger, None
        if pinger is not None:
            pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pinger

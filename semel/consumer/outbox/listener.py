"""The relay's wake-up: ``LISTEN`` on the outbox table's channel.

Every insert into the outbox table sends ``NOTIFY <table>`` in its own
transaction (PostgreSQL delivers it at commit, and drops it on a rollback),
so a relay in any process learns of a committed message within a round trip.
The listener holds one autocommit connection of its own, outside any pool: a
pooled connection would be handed to others, and notifications arrive only
on the connection that listens.

When that connection is lost (PostgreSQL restarted, the backend terminated,
a network cut found by TCP keep-alives) the listener connects again after a
growing pause, and wakes the relay once it listens again: what was committed
meanwhile is sent by that pass. A notification lost in between costs only
latency; the relay's periodic sweep finds the row anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psycopg
import structlog
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from semel.consumer.backoff import Backoff

RECONNECT_BACKOFF = (0.2, 10.0)  # first and longest pause before listening again
CONNECT_TIMEOUT = 3  # seconds
# Keep-alives find a connection whose server vanished without closing it,
# where nothing else would: a listener only ever reads.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 3,
              "keepalives_count": 3, "tcp_user_timeout": 20_000}  # fmt: skip

log = structlog.get_logger("semel.outbox")


class Listener:
    """Sets ``wake`` on every notification on ``channel``, reconnecting until stopped."""

    def __init__(self, dsn: str, channel: str, wake: asyncio.Event) -> None:
        self._dsn = dsn
        self._channel = channel
        self._wake = wake
        self.listening = asyncio.Event()  # set while LISTEN is in force (tests, readiness)
        self.pid: int | None = None  # the listening backend's process id

    def _kwargs(self) -> dict[str, Any]:
        given = conninfo_to_dict(self._dsn)
        own = {"connect_timeout": CONNECT_TIMEOUT, **KEEPALIVES}
        return {"autocommit": True, "application_name": "semel-relay"} | {
            name: value for name, value in own.items() if name not in given
        }

    async def run(self) -> None:
        """Listen until cancelled; a lost connection is only a pause."""
        backoff = Backoff(*RECONNECT_BACKOFF)
        while True:
            try:
                await self._listen(backoff)
            except Exception as exc:  # the listener must outlive any one connection
                error = " ".join(str(exc).split()) or type(exc).__name__
            finally:
                self.listening.clear()
                self.pid = None
            pause = backoff.next()
            log.warning(
                "outbox listener lost its connection", error=error, retry_in=round(pause, 2)
            )
            await asyncio.sleep(pause)

    async def _listen(self, backoff: Backoff) -> None:
        conn = await psycopg.AsyncConnection.connect(self._dsn, **self._kwargs())
        try:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            self.pid = conn.info.backend_pid
            self.listening.set()
            backoff.reset()
            self._wake.set()  # whatever committed while nobody listened
            async for _ in conn.notifies():
                self._wake.set()
        finally:
            with contextlib.suppress(Exception):
                await conn.close()
        raise psycopg.OperationalError("the notification stream ended")

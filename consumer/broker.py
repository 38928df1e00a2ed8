"""The broker connection: robust (reconnects and reopens its channels by itself).

A broker that is not up yet at start-up is waited for, like one that drops
later, up to ``broker_give_up`` seconds; then the process gives up so its
supervisor can restart it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aio_pika
import structlog
from aio_pika.abc import AbstractRobustConnection
from aiormq.exceptions import AMQPConnectionError, ProbableAuthenticationError

from settings import Settings, redact

RECONNECT_INTERVAL = 1.0  # seconds between the robust connection's reconnect attempts
CONNECT_TIMEOUT = 10.0
CLOSE_TIMEOUT = 5.0
_CONNECT_BACKOFF = (0.5, 5.0)

log = structlog.get_logger("semel.broker")


class BrokerUnavailable(Exception):
    """The broker could not be reached within the give-up limit (or refused the login)."""


async def connect(url: str, give_up: float) -> AbstractRobustConnection:
    """A robust connection to ``url`` (amqp:// or amqps://)."""
    deadline = time.monotonic() + give_up
    pause, longest = _CONNECT_BACKOFF
    while True:
        try:
            return await aio_pika.connect_robust(
                url, timeout=CONNECT_TIMEOUT, reconnect_interval=RECONNECT_INTERVAL
            )
        except ProbableAuthenticationError as exc:
            raise BrokerUnavailable(f"broker refused the login: {redact(str(exc))}") from None
        except (TimeoutError, AMQPConnectionError, OSError) as exc:
            if time.monotonic() + pause > deadline:
                raise BrokerUnavailable(
                    f"broker unreachable for {give_up:g}s: {redact(str(exc)) or type(exc).__name__}"
                ) from None
            log.warning("broker unreachable, retrying", error=redact(repr(exc)), retry_in=pause)
        await asyncio.sleep(pause)
        pause = min(pause * 2, longest)


async def open_connection(settings: Settings) -> AsyncIterator[AbstractRobustConnection]:
    """The container's Resource: connect, hand out, close at shutdown."""
    connection = await connect(settings.amqp_url, settings.broker_give_up)
    try:
        yield connection
    finally:
        # Bounded: closing a robust connection in the middle of a reconnect can stall.
        try:
            await asyncio.wait_for(connection.close(), CLOSE_TIMEOUT)
        except (TimeoutError, AMQPConnectionError, OSError) as exc:
            log.warning("broker connection not closed cleanly", error=redact(repr(exc)))

"""Broker connections: the worker's robust one, and a command's plain one.

The worker's connection reconnects and reopens its channels by itself. A
broker that is not up yet at start-up is waited for, like one that drops
later, up to ``give_up`` seconds; then the process gives up so its supervisor
can restart it. A command (publish, dlq) connects once and reports at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import aio_pika
import structlog
from aio_pika.abc import AbstractConnection, AbstractRobustConnection
from aiormq.exceptions import AMQPConnectionError, ProbableAuthenticationError

from consumer.backoff import Backoff
from consumer.errors import BrokerUnavailable
from consumer.names import (
    BROKER_CALL_TIMEOUT,
    CONNECT_TIMEOUT,
    RECONNECT_INTERVAL,
    TOOL_CONNECT_TIMEOUT,
)

CONNECT_BACKOFF = (0.5, 5.0)  # first and longest pause between start-up connection attempts

log = structlog.get_logger("semel.broker")


async def connect(url: str, give_up: float) -> AbstractRobustConnection:
    """A robust connection to ``url`` (amqp:// or amqps://)."""
    deadline = time.monotonic() + give_up
    backoff = Backoff(*CONNECT_BACKOFF)
    while True:
        try:
            return await aio_pika.connect_robust(
                url, timeout=CONNECT_TIMEOUT, reconnect_interval=RECONNECT_INTERVAL
            )
        except ProbableAuthenticationError as exc:
            raise BrokerUnavailable(f"broker refused the login: {exc}") from None
        except (TimeoutError, AMQPConnectionError, OSError) as exc:
            if time.monotonic() + backoff.pause > deadline:
                raise BrokerUnavailable(
                    f"broker unreachable for {give_up:g}s: {str(exc) or type(exc).__name__}"
                ) from None
            log.warning("broker unreachable, retrying", error=repr(exc), retry_in=backoff.pause)
        await backoff.wait()


async def open_connection(url: str, give_up: float) -> AsyncIterator[AbstractRobustConnection]:
    """The container's Resource for the worker: connect, hand out, close at shutdown."""
    connection = await connect(url, give_up)
    try:
        yield connection
    finally:
        await _close(connection)


async def open_tool_connection(url: str) -> AsyncIterator[AbstractConnection]:
    """The container's Resource for a command: one attempt, closed at the end."""
    # The client libraries log what they then raise; the command prints that as
    # its one error line, so their records must not reach Python's last-resort
    # stderr handler.
    for name in ("aiormq", "aio_pika"):
        client_log = logging.getLogger(name)
        if not client_log.handlers:
            client_log.addHandler(logging.NullHandler())
    connection = await aio_pika.connect(url, timeout=TOOL_CONNECT_TIMEOUT)
    try:
        yield connection
    finally:
        await _close(connection)


async def _close(connection: AbstractConnection) -> None:
    # Bounded: closing a robust connection in the middle of a reconnect can stall.
    try:
        await asyncio.wait_for(connection.close(), BROKER_CALL_TIMEOUT)
    except (TimeoutError, AMQPConnectionError, OSError) as exc:
        log.warning("broker connection not closed cleanly", error=repr(exc))

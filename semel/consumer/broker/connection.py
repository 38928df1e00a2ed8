"""Broker connections: the worker's robust one, and a command's plain one.

Both take the addresses of ``SEMEL_AMQP_URL`` (one, or one per cluster node)
and try them in an order shuffled once per process, so consumers spread over
the nodes. The worker's connection reconnects and reopens its channels by
itself; when it loses its node it moves on to the next address of its order,
and the next, until one answers (:class:`ClusterConnection`). A broker that
is not up yet at start-up is waited for, like one that drops later, up to
``give_up`` seconds; then the process gives up so its supervisor can restart
it. A command (publish, dlq) takes the first address that answers and
reports at once when none does.

A URL without a ``heartbeat`` gets :data:`DEFAULT_HEARTBEAT`: a node cut off
without a reset (a partition, a host gone) is noticed only by missed
heartbeats, and the client library's own default of 60 s takes three
minutes to give one up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aio_pika
import structlog
from aio_pika.abc import AbstractConnection
from aio_pika.robust_connection import RobustConnection
from aio_pika.tools import CallbackCollection
from aiormq.exceptions import (
    AMQPConnectionError,
    ChannelInvalidStateError,
    ChannelNotFoundEntity,
    ProbableAuthenticationError,
)
from yarl import URL

from semel.consumer.backoff import Backoff
from semel.consumer.errors import BrokerUnavailable, ConfigurationError
from semel.consumer.names import (
    BROKER_CALL_TIMEOUT,
    CONNECT_TIMEOUT,
    RECONNECT_INTERVAL,
    TOOL_CONNECT_TIMEOUT,
)
from semel.consumer.stopping import within

CONNECT_BACKOFF = (0.5, 5.0)  # first and longest pause between rounds of start-up attempts
DEFAULT_HEARTBEAT = 10  # seconds; a silent node is given up after about three of them
_UNREACHABLE = (TimeoutError, AMQPConnectionError, OSError)
# What a call on a connection whose node just died raises: the reset itself, or
# a channel closed with it.
_DROPPED = (AMQPConnectionError, ChannelInvalidStateError, ConnectionError)
T = TypeVar("T")
_NODE_DOWN = "is down or inaccessible"  # the broker's words for a queue on a node that is down

log = structlog.get_logger("semel.broker")


def broker_urls(addresses: Sequence[str]) -> list[URL]:
    """The addresses as the client takes them, heartbeat included, in a shuffled order."""
    urls = []
    for address in addresses:
        url = URL(address)
        if "heartbeat" not in url.query:
            url = url.update_query(heartbeat=DEFAULT_HEARTBEAT)
        urls.append(url)
    return random.sample(urls, len(urls))


def node_of(url: URL) -> str:
    """``host:port`` of a broker URL: what logs and ``/readyz`` show (never credentials)."""
    host = url.host or ""
    port = url.port or (5671 if url.scheme == "amqps" else 5672)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ClusterConnection(RobustConnection):
    """A robust connection that moves on to the next address whenever it loses one.

    aio-pika's robust connection reconnects to its one URL; this one takes a
    list. Every lost connection and every failed attempt passes through
    ``_on_connection_close`` (aio-pika routes both there), which points the
    next attempt at the next address, round and round: a node that is gone
    costs one attempt, and the other nodes are tried before it is tried again.
    Channels, their reopen callbacks (the intake's consume-again) and
    publisher confirms are aio-pika's, restored as they would be on one node.
    """

    def __init__(self, urls: Sequence[URL], first: int = 0, **kwargs: Any) -> None:
        if not urls:
            raise ValueError("no broker address")
        self._urls = list(urls)
        self._next = first % len(self._urls)
        super().__init__(self._urls[self._next], **kwargs)
        self._tried: URL = self.url  # the address last tried, which aio-pika's log lines name
        self._node: str | None = None
        self._last_node: str | None = None  # the node of the last established connection
        self.failover_callbacks: CallbackCollection[ClusterConnection, []] = CallbackCollection(
            self
        )

    @property
    def node(self) -> str | None:
        """``host:port`` of the node connected to now; None while not connected."""
        return self._node if self.connected.is_set() else None

    def __str__(self) -> str:
        # aio-pika logs a failed attempt or a lost connection after this class
        # has already pointed ``url`` at the next address: name the one it is about.
        url = self._tried
        return str(url.with_password("******") if url.password else url)

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        self._node = None
        self._tried = self.url
        self._next = (self._next + 1) % len(self._urls)
        self.url = self._urls[self._next]
        await super()._on_connection_close(closing)

    async def _on_connected(self) -> None:
        node = node_of(self.url)
        self._tried, self._node = self.url, node
        # Raises when the channels cannot be restored: the connection is then
        # closed, and the next attempt goes to the next node.
        await super()._on_connected()
        lost, self._last_node = self._last_node, node
        if lost is not None and lost != node:
            log.warning("broker connection moved to another node", lost=lost, node=node)
            await self.failover_callbacks()


async def connect(addresses: Sequence[str], give_up: float) -> ClusterConnection:
    """A robust connection to the first of ``addresses`` (amqp:// or amqps://) that answers."""
    urls = broker_urls(addresses)
    deadline = time.monotonic() + give_up
    backoff = Backoff(*CONNECT_BACKOFF)
    attempt = 0
    while True:
        first = attempt % len(urls)
        connection = ClusterConnection(urls, first, reconnect_interval=RECONNECT_INTERVAL)
        attempt += 1
        try:
            await connection.connect(timeout=CONNECT_TIMEOUT)
            # debug: a start-up error must stay the one line on stderr; /readyz names the node
            log.debug("connected to the broker", node=connection.node, addresses=len(urls))
            return connection
        except ProbableAuthenticationError as exc:
            raise login_refused(exc) from None
        except _UNREACHABLE as exc:
            node = node_of(urls[first])
            error = str(exc) or type(exc).__name__
            if attempt % len(urls):  # the next node at once; a pause after each round
                log.warning("broker node unreachable, trying the next", node=node, error=error)
                continue
            if time.monotonic() + backoff.pause > deadline:
                raise BrokerUnavailable(f"broker unreachable for {give_up:g}s: {error}") from None
            log.warning("broker unreachable, retrying", error=error, retry_in=backoff.pause)
        await backoff.wait()


async def through_drops(
    step: Callable[[], Awaitable[T]], connection: AbstractConnection, give_up: float
) -> T:
    """Run a start-up ``step`` (declare, open channels, consume), again each time the
    connection drops under it, once it is back, for up to ``give_up`` seconds.

    The robust connection reconnects by itself, to another node if it must, but
    a call in flight when its node dies fails: at start-up that call is
    semel's own, and a node lost then is no more a reason to exit than later.
    """
    end = time.monotonic() + give_up
    backoff = Backoff(*CONNECT_BACKOFF)
    while True:
        try:
            return await step()
        except (*_DROPPED, ChannelNotFoundEntity, RuntimeError) as exc:
            # aio-pika says "connection closed" as a bare RuntimeError: a drop only
            # when the connection is down; any other one is a defect, not retried.
            # A classic queue whose node is down is NOT_FOUND until the node is back.
            if isinstance(exc, ChannelNotFoundEntity):
                if _NODE_DOWN not in str(exc):
                    raise
            elif not isinstance(exc, _DROPPED) and _is_up(connection):
                raise
            error = str(exc) or type(exc).__name__
            if time.monotonic() + backoff.pause > end:
                raise BrokerUnavailable(f"broker unreachable for {give_up:g}s: {error}") from None
            log.warning("broker node lost during start-up, trying again", error=error)
        # A pause first: the close is noticed a moment after the call failed.
        await backoff.wait()
        connected = getattr(connection, "connected", None)
        if isinstance(connected, asyncio.Event):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(connected.wait(), max(0.0, end - time.monotonic()))


def _is_up(connection: AbstractConnection) -> bool:
    connected = getattr(connection, "connected", None)
    up = not connection.is_closed
    return up and (not isinstance(connected, asyncio.Event) or connected.is_set())


def login_refused(exc: ProbableAuthenticationError) -> ConfigurationError:
    """A refused login is the operator's to fix, like a store that refuses one: no
    restart would let it in (exit 2)."""
    return ConfigurationError(
        f"broker refused the login: {exc}; check the user and password of SEMEL_AMQP_URL"
    )


async def open_connection(
    addresses: Sequence[str], give_up: float
) -> AsyncIterator[ClusterConnection]:
    """The container's Resource for the worker: connect, hand out, close at shutdown."""
    connection = await connect(addresses, give_up)
    try:
        yield connection
    finally:
        await _close(connection)


async def open_tool_connection(addresses: Sequence[str]) -> AsyncIterator[AbstractConnection]:
    """The container's Resource for a command: each address once, closed at the end."""
    # The client libraries log what they then raise; the command prints that as
    # its one error line, so their records must not reach Python's last-resort
    # stderr handler.
    for name in ("aiormq", "aio_pika"):
        client_log = logging.getLogger(name)
        if not client_log.handlers:
            client_log.addHandler(logging.NullHandler())
    connection = await _first_answering(broker_urls(addresses))
    try:
        yield connection
    finally:
        await _close(connection)


async def _first_answering(urls: list[URL]) -> AbstractConnection:
    failures = []
    for url in urls:
        try:
            return await aio_pika.connect(url, timeout=TOOL_CONNECT_TIMEOUT)
        except ProbableAuthenticationError as exc:
            # The nodes of a cluster share their users: no other would do better.
            raise login_refused(exc) from None
        except _UNREACHABLE as exc:
            if len(urls) == 1:
                raise
            failures.append(f"{node_of(url)}: {str(exc) or type(exc).__name__}")
    raise BrokerUnavailable(f"broker: no node answered ({'; '.join(failures)})")


async def _close(connection: AbstractConnection) -> None:
    # Bounded: closing a robust connection in the middle of a reconnect can stall,
    # and so can its unwinding once cancelled.
    try:
        await within(BROKER_CALL_TIMEOUT, "closing the broker connection", connection.close())
    except (AMQPConnectionError, OSError) as exc:
        log.warning("broker connection not closed cleanly", error=repr(exc))

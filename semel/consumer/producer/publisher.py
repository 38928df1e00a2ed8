"""``Publisher``: publish to semel's consumers the way they read messages.

Each message gets its idempotency key where ``SEMEL_KEY_SOURCE`` says the
consumer reads it (:func:`~semel.consumer.producer.envelope.envelope`), a
message id (a new uuid4 unless given), and goes out persistent and
``mandatory`` on a publisher-confirm channel through semel's one confirmed
publish. Each ends with a :class:`~semel.consumer.producer.receipt.Receipt`
after the bounded retry of :mod:`semel.consumer.producer.retry`.

This class is built from plain values: :meth:`Publisher.connect` takes the
broker addresses, or an exchange on a channel of the caller's own is given to
the constructor. ``semel.Publisher.open()`` reads the settings
(``semel.consumer.embedded.publishing``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Self

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange

from semel.consumer.broker.connection import connect
from semel.consumer.broker.publishing import BROKER_TROUBLE, publish_confirmed
from semel.consumer.delivery.message import KeySource
from semel.consumer.names import BROKER_CALL_TIMEOUT, CONFIRM_TIMEOUT, IDEMPOTENCY_HEADER
from semel.consumer.producer.batch import Batch
from semel.consumer.producer.envelope import envelope
from semel.consumer.producer.opening import Opening
from semel.consumer.producer.receipt import Answer, Message, Prepared, Receipt
from semel.consumer.producer.retry import Retry
from semel.stores.base import JSON

PUBLISH_WINDOW = 256  # unconfirmed publishes of one batch in flight: fast, yet bounded
DEFAULT_SOURCE = KeySource("header", IDEMPOTENCY_HEADER)
CONNECT_GIVE_UP = 30.0  # seconds :meth:`Publisher.connect` waits for a broker that is away

log = structlog.get_logger("semel.publisher")


def describe(exc: BaseException) -> str:
    """One line for an error: its type, and its text when it has one."""
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


class Publisher:
    """Publishes to one exchange; safe to share between the tasks of one event loop."""

    def __init__(
        self,
        exchange: AbstractExchange,
        *,
        source: KeySource = DEFAULT_SOURCE,
        retry: Retry | None = None,
        window: int = PUBLISH_WINDOW,
        confirm_timeout: float = CONFIRM_TIMEOUT,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        if not 0 < confirm_timeout <= CONFIRM_TIMEOUT:
            # semel's confirmed publish gives up at CONFIRM_TIMEOUT whatever is asked.
            raise ValueError(f"confirm_timeout must be in (0, {CONFIRM_TIMEOUT:g}] seconds")
        self.exchange = exchange
        self.source = source
        self.retry = retry or Retry()
        self.window = window
        self.confirm_timeout = confirm_timeout
        self._on_close = on_close
        # Message ids being published now: the client matches a returned message
        # to its publish by id, so two publishes of one id never overlap.
        self._sending: dict[str, asyncio.Event] = {}

    @classmethod
    def connect(
        cls,
        addresses: str | Sequence[str],
        *,
        exchange: str = "",
        key_source: str | KeySource = DEFAULT_SOURCE,
        give_up: float = CONNECT_GIVE_UP,
        retry: Retry | None = None,
        window: int = PUBLISH_WINDOW,
        confirm_timeout: float = CONFIRM_TIMEOUT,
    ) -> Opening[Self]:
        """A publisher on a robust connection of its own to the first of ``addresses``
        that answers (one ``amqp://`` URL per node), waited for up to ``give_up``
        seconds; ``exchange=""`` is the default exchange (routing by queue name).

        ``async with Publisher.connect(...) as publisher:``, or
        ``publisher = await Publisher.connect(...)`` and :meth:`close` it later.
        """
        source = key_source if isinstance(key_source, KeySource) else KeySource.parse(key_source)
        urls = [addresses] if isinstance(addresses, str) else list(addresses)

        async def opened() -> Self:
            connection = await connect(urls, give_up)
            try:
                channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
                # Not declared, nor checked: the consumer declares semel's exchange,
                # perhaps after this service starts. A missing one fails each publish.
                target = await _exchange(channel, exchange)
            except BaseException:
                await _closed(connection)
                raise

            async def close() -> None:
                await _closed(connection)

            return cls(
                target,
                source=source,
                retry=retry,
                window=window,
                confirm_timeout=confirm_timeout,
                on_close=close,
            )

        return Opening(opened)

    def prepare(
        self,
        body: JSON | bytes,
        *,
        key: str,
        routing_key: str,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        content_type: str | None = None,
    ) -> Prepared:
        """``body`` with ``key`` placed for the consumer. Raises ``ValueError`` for a
        key the consumer would refuse, or a body that cannot carry it."""
        sealed = envelope(
            self.source,
            key,
            body,
            headers=dict(headers or {}),
            message_id=message_id,
            content_type=content_type,
        )
        return Prepared(sealed, routing_key, key)

    async def publish(
        self,
        body: JSON | bytes,
        *,
        key: str,
        routing_key: str,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        content_type: str | None = None,
    ) -> Receipt:
        """Publish one message; its receipt once the broker answered (or the retries
        ran out). ``bytes`` are sent as they are, anything else as JSON."""
        prepared = self.prepare(
            body,
            key=key,
            routing_key=routing_key,
            headers=headers,
            message_id=message_id,
            content_type=content_type,
        )
        (receipt,) = await self.publish_prepared([prepared])
        return receipt

    async def publish_many(
        self, messages: Iterable[Message], *, window: int | None = None
    ) -> list[Receipt]:
        """Publish a batch in order, at most ``window`` unconfirmed at once; one
        receipt per message, in the batch's order. Every key is checked before
        the first is sent (``ValueError``). A message left without an answer
        after its retries stops the batch: the rest are answered ``failed``
        with ``attempts == 0``, never sent."""
        prepared = [
            self.prepare(
                m.body,
                key=m.key,
                routing_key=m.routing_key,
                headers=m.headers,
                message_id=m.message_id,
                content_type=m.content_type,
            )
            for m in messages
        ]
        return await self.publish_prepared(prepared, window=window)

    async def publish_prepared(
        self,
        messages: Sequence[Prepared],
        *,
        window: int | None = None,
        rate: float = 0.0,
        on_settled: Callable[[], None] | None = None,
    ) -> list[Receipt]:
        """:meth:`publish_many` for messages whose key the caller placed;
        ``rate`` caps messages per second (0: as fast as confirms allow),
        ``on_settled`` is called as each message gets its answer."""
        ids = [m.envelope.message_id or str(uuid.uuid4()) for m in messages]
        batch = Batch(self._deliver, window or self.window, on_settled or (lambda: None))
        return await batch.run(messages, ids, rate)

    async def _deliver(self, message: Prepared, message_id: str) -> Receipt:
        """Publish, and again under the retry rule: one receipt."""
        while (earlier := self._sending.get(message_id)) is not None:
            await earlier.wait()
        done = self._sending[message_id] = asyncio.Event()
        try:
            attempts = 0
            while True:
                attempts += 1
                answer, error = await self._attempt(message, message_id)
                if not self.retry.again(answer, attempts):
                    return Receipt(message_id, message.key, answer, attempts, error)
                pause = self.retry.pause(attempts)
                log.info(
                    "publish not confirmed, sending again",
                    message_id=message_id,
                    answer=answer.value,
                    attempts=attempts,
                    retry_in=round(pause, 3),
                    error=error,
                )
                await asyncio.sleep(pause)
        finally:
            del self._sending[message_id]
            done.set()

    async def _attempt(self, message: Prepared, message_id: str) -> tuple[Answer, str | None]:
        sealed = message.envelope
        outgoing = aio_pika.Message(
            sealed.body,
            headers=sealed.headers,
            message_id=message_id,
            content_type=sealed.content_type,
        )
        try:
            published = await asyncio.wait_for(
                publish_confirmed(self.exchange, outgoing, message.routing_key),
                self.confirm_timeout,
            )
        except TimeoutError as exc:
            return Answer.TIMED_OUT, describe(exc)
        except BROKER_TROUBLE as exc:
            return Answer.FAILED, describe(exc)
        return Answer(published.value), None

    async def close(self) -> None:
        """Close the connection :meth:`connect` opened (nothing for an exchange
        given by the caller); a publish still waiting for its answer ends failed."""
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            await on_close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


async def _exchange(channel: AbstractChannel, name: str) -> AbstractExchange:
    if not name:
        return channel.default_exchange
    return await channel.get_exchange(name, ensure=False)


async def _closed(connection: AbstractConnection) -> None:
    # Bounded: closing a robust connection in the middle of a reconnect can stall.
    with contextlib.suppress(TimeoutError, *BROKER_TROUBLE, OSError):
        await asyncio.wait_for(connection.close(), BROKER_CALL_TIMEOUT)

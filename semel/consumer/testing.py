"""A testing kit for handlers: what semel would do with a message, without a broker.

:class:`HandlerKit` sends messages through the worker's own pipeline (key,
claim, handler, completion, retry and dead-letter decisions, typed-body
validation) on an in-memory SQLite store, and answers each with a
:class:`Verdict`. Only the broker's edge is replaced: the worker's
:class:`~semel.consumer.broker.settle.Settler` publishes its copies to an
in-process exchange that confirms at once, and the delivery records its ack
or nack. So a verdict is the worker's decision, and a copy's headers are the
ones it would publish::

    async with HandlerKit(order_paid, key_source="body:order_id") as kit:
        verdict = await kit.send({"order_id": "o-1", "amount": 5})
        assert verdict.acked and verdict.stored == {"charged": 5}

Settings come from the environment as for ``semel consume``, keyword
arguments over them (``max_attempts=3``, ``retry_delays=[1, 5]``); the store
settings are ignored. :func:`context` builds a handler's context for a plain
unit test; :class:`SyncHandlerKit` runs the kit from synchronous tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import TracebackType
from typing import Any, cast

import aio_pika
import orjson
from aio_pika.abc import AbstractExchange
from pamqp.commands import Basic

from semel.consumer.broker.copies import returned_copy
from semel.consumer.broker.settle import Settler
from semel.consumer.container import checked_settings, open_backend, pipeline_config
from semel.consumer.delivery.decide import DeadLetter, Outcome, Result, Retry, Settle
from semel.consumer.delivery.handler import Context
from semel.consumer.delivery.message import KeySource, best_effort_key, parse
from semel.consumer.delivery.pipeline import Pipeline
from semel.consumer.delivery.typed import bind
from semel.consumer.errors import BadMessage
from semel.consumer.names import H_ATTEMPTS, Reason, Topology
from semel.stores.base import JSON, Record, Store

__all__ = ["HandlerKit", "Published", "SyncHandlerKit", "Verdict", "context"]


def context(
    body: Mapping[str, Any] | None = None,
    *,
    key: str = "key-1",
    headers: Mapping[str, Any] | None = None,
    routing_key: str = "",
    message_id: str | None = None,
    attempt: int = 1,
    fence: int = 1,
    validated: Any = None,
) -> Context:
    """A handler's context as the worker builds it, for calling a handler directly."""
    return Context(
        key=key,
        body=dict(body or {}),
        headers=dict(headers or {}),
        routing_key=routing_key,
        message_id=message_id,
        attempt=attempt,
        fence=fence,
        validated=validated,
    )


@dataclass(frozen=True, slots=True)
class Published:
    """A copy the worker would have published: where to, and the message itself."""

    exchange: str
    routing_key: str
    message: aio_pika.Message

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.message.headers)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What semel would have done with one message."""

    key: str | None
    attempt: int  # the attempt this delivery was (x-semel-attempts, 1 on first delivery)
    outcome: Outcome  # the settled log line's outcome: completed, duplicate, retry ...
    frame: str  # "ack" or "nack": how the delivery was settled
    reason: Reason | None = None  # a dead letter's x-semel-reason
    error: str | None = None  # the handler's failure, as x-semel-error carries it
    delay: float | None = None  # a retry's wait, in seconds
    tier: int | None = None  # a retry's tier, 1-based (the last one repeats)
    copy: Published | None = None  # the retry copy, dead letter or parked copy
    record: Record | None = None  # the key's record in the store after the delivery

    @property
    def result(self) -> Result:
        return self.outcome.result

    @property
    def acked(self) -> bool:
        """The handler ran and its result is stored."""
        return self.outcome is Outcome.COMPLETED

    @property
    def duplicate(self) -> bool:
        """Answered from the store, the handler not run."""
        return self.result is Result.DUPLICATE

    @property
    def parked(self) -> bool:
        """Another delivery holds the key: a copy waits in the conflict queue."""
        return self.result is Result.CONFLICT

    @property
    def retried(self) -> bool:
        return self.result is Result.RETRIED

    @property
    def dead_lettered(self) -> bool:
        return self.result is Result.DEAD_LETTERED

    @property
    def stored(self) -> JSON:
        """The handler's stored result (``None`` when there is none)."""
        return self.record.result if self.record is not None else None

    @property
    def headers(self) -> dict[str, Any]:
        """The headers of the copy the worker would publish; empty without one."""
        return self.copy.headers if self.copy is not None else {}


@dataclass
class _Sent:
    """A delivery of the work queue, as the pipeline reads one; it notes how it was settled."""

    body: bytes
    headers: dict[str, Any]
    message_id: str | None = None
    routing_key: str | None = None
    exchange: str | None = ""
    content_type: str | None = "application/json"
    content_encoding: str | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    timestamp: datetime | None = None
    type: str | None = None
    app_id: str | None = None
    delivery_tag: int | None = 1
    frame: str = field(default="", init=False)

    @classmethod
    def of(cls, message: aio_pika.Message, exchange: str, routing_key: str) -> _Sent:
        return cls(
            message.body,
            dict(message.headers),
            message_id=message.message_id,
            routing_key=routing_key,
            exchange=exchange,
            content_type=message.content_type,
        )

    async def ack(self) -> None:
        self.frame = "ack"

    async def nack(self, *, requeue: bool = True) -> None:
        self.frame = "nack"


_copies: ContextVar[list[Published]] = ContextVar("semel_testing_copies")


class _Exchange:
    """An exchange that confirms every publish at once and keeps what was published."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def publish(self, message: aio_pika.Message, routing_key: str, **_: Any) -> Basic.Ack:
        _copies.get().append(Published(self.name, routing_key, message))
        return Basic.Ack()


class HandlerKit:
    """Runs messages through the worker's pipeline on an in-memory SQLite store.

    The store lives as long as the kit: a key completed by one ``send`` is a
    duplicate for the next. Use it as ``async with``, or :meth:`start` and
    :meth:`close`.
    """

    def __init__(self, handler: Callable[..., Any], **settings: object) -> None:
        overrides = {**settings, "store": "sqlite", "sqlite_path": ":memory:"}
        self.settings = checked_settings(**overrides, transactional=False)
        self.config = pipeline_config(self.settings)
        self._handler = bind(handler)  # as the container binds a loaded handler
        self._source = KeySource.parse(self.settings.key_source)
        names = Topology(self.settings.queue)
        self._retry = _Exchange(names.retry_exchange)
        self._dead = _Exchange(names.dead_letter_exchange)
        self._settler = Settler(
            cast(AbstractExchange, self._retry), cast(AbstractExchange, self._dead), names
        )
        self._stack = contextlib.AsyncExitStack()
        self._store: Store | None = None
        self._pipeline: Pipeline | None = None

    async def start(self) -> HandlerKit:
        opened = contextlib.asynccontextmanager(open_backend)(self.settings)
        self._store = await self._stack.enter_async_context(opened)
        self._pipeline = Pipeline(
            store=self._store, handler=self._handler, settler=self._settler, config=self.config
        )
        return self

    async def close(self) -> None:
        await self._stack.aclose()

    async def __aenter__(self) -> HandlerKit:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("the kit is not started: use it as `async with HandlerKit(...)`")
        return self._store

    async def send(
        self,
        body: Mapping[str, Any] | bytes,
        *,
        key: str | None = None,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        routing_key: str = "",
        content_type: str = "application/json",
    ) -> Verdict:
        """Deliver one message as a producer published it; ``key`` goes where the
        key source looks (a header or the message id; in a body, put it there)."""
        sent_headers = dict(headers or {})
        if key is not None:
            if self._source.kind == "header":
                sent_headers[self._source.name] = key
            elif self._source.kind == "message_id":
                message_id = key
            else:
                raise ValueError(
                    f"the key is read from the body ({self._source.name}): put it there"
                )
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        return await self._deliver(
            _Sent(
                raw,
                sent_headers,
                message_id=message_id,
                routing_key=routing_key,
                content_type=content_type,
            )
        )

    async def send_many(self, bodies: list[Mapping[str, Any]], **options: Any) -> list[Verdict]:
        """Each of ``bodies`` in turn, with the same ``options`` as :meth:`send`."""
        return [await self.send(body, **options) for body in bodies]

    async def redeliver(self, verdict: Verdict) -> Verdict:
        """The copy of ``verdict`` (a retry or a parked copy) delivered again, as its
        delay queue hands it back to the work queue once its wait is over."""
        if verdict.copy is None or verdict.dead_lettered:
            raise ValueError(
                f"a delivery that ended {verdict.outcome.value} has no copy to deliver"
            )
        copy = verdict.copy
        back = returned_copy(_Sent.of(copy.message, copy.exchange, copy.routing_key))
        return await self._deliver(_Sent.of(back, copy.exchange, copy.routing_key))

    async def _deliver(self, message: _Sent) -> Verdict:
        if self._pipeline is None:
            raise RuntimeError("the kit is not started: use it as `async with HandlerKit(...)`")
        copies: list[Published] = []
        _copies.set(copies)  # this delivery's own: sends may run at the same time
        decision = await self._pipeline.handle(message)
        copied = copies[-1] if copies else None
        return await self._verdict(message, decision, copied)

    def _key_of(self, message: _Sent) -> str | None:
        """The key as the pipeline read it, if the message has one."""
        try:
            parsed = parse(
                message.body,
                message.content_type,
                message.headers,
                message.message_id,
                source=self._source,
                limit=self.config.rules.max_body_bytes,
            )
        except BadMessage:
            return best_effort_key(message.headers, message.message_id, self._source)
        return parsed.key

    async def _verdict(self, message: _Sent, decision: Settle, copied: Published | None) -> Verdict:
        key = self._key_of(message)
        verdict = Verdict(
            key=key,
            attempt=int(message.headers.get(H_ATTEMPTS, 1)),
            outcome=decision.outcome,
            frame=message.frame,
            error=None
            if decision.outcome is Outcome.COMPLETED
            else getattr(decision, "error", None),
            copy=copied,
            record=await self.store.get(key) if key else None,
        )
        if isinstance(decision, DeadLetter):
            return replace(verdict, reason=decision.reason)
        if isinstance(decision, Retry):
            tiers = self.config.retry.delays
            return replace(
                verdict, delay=decision.delay, tier=min(decision.next_attempt - 1, len(tiers))
            )
        return verdict


class SyncHandlerKit:
    """:class:`HandlerKit` for synchronous tests: the same calls, each run to its end
    on an event loop of the kit's own."""

    def __init__(self, handler: Callable[..., Any], **settings: object) -> None:
        self._runner = asyncio.Runner()
        self._kit = self._runner.run(HandlerKit(handler, **settings).start())

    def send(self, body: Mapping[str, Any] | bytes, **options: Any) -> Verdict:
        return self._runner.run(self._kit.send(body, **options))

    def send_many(self, bodies: list[Mapping[str, Any]], **options: Any) -> list[Verdict]:
        return self._runner.run(self._kit.send_many(bodies, **options))

    def redeliver(self, verdict: Verdict) -> Verdict:
        return self._runner.run(self._kit.redeliver(verdict))

    def close(self) -> None:
        try:
            self._runner.run(self._kit.close())
        finally:
            self._runner.close()

    def __enter__(self) -> SyncHandlerKit:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

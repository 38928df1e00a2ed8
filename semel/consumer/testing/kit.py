"""The kit itself: messages through the worker's own pipeline, an in-memory
store, and exchanges of its own that confirm every copy at once (see
:mod:`semel.consumer.testing`)."""

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

from semel.consumer.app import App
from semel.consumer.broker.copies import returned_copy
from semel.consumer.broker.settle import Settler
from semel.consumer.container import checked_settings, open_backend
from semel.consumer.delivery.decide import DeadLetter, Outcome, Retry, Settle
from semel.consumer.delivery.pipeline import Pipeline
from semel.consumer.delivery.routes import topic_matches
from semel.consumer.names import H_ATTEMPTS, Topology
from semel.consumer.plan import QueuePlan, plans_for
from semel.consumer.testing.verdicts import Published, Verdict
from semel.stores.base import Store


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


class _Queue:
    """One planned queue of the kit: its settler, on exchanges of the kit's own, and
    its pipeline once the store is open."""

    def __init__(self, plan: QueuePlan) -> None:
        self.plan = plan
        names = Topology(plan.worker.queue)
        self.settler = Settler(
            cast(AbstractExchange, _Exchange(names.retry_exchange)),
            cast(AbstractExchange, _Exchange(names.dead_letter_exchange)),
            names,
        )
        self.pipeline: Pipeline | None = None

    def bound_to(self, routing_key: str) -> bool:
        return any(topic_matches(p, routing_key) for p in self.plan.topology.binding_keys)

    def serves(self, handler: str) -> bool:
        return any(route.name == handler for route in self.plan.routes.all)


class HandlerKit:
    """Runs messages through the worker's pipeline on an in-memory SQLite store.

    ``target`` is a handler, or an :class:`~semel.consumer.app.App` whose
    handlers each get their queue, as ``semel consume`` plans them: a message
    goes to the queue whose bindings match its routing key. The store lives as
    long as the kit: a key completed by one ``send`` is a duplicate for the
    next. Use it as ``async with``, or :meth:`start` and :meth:`close`.
    """

    def __init__(self, target: Callable[..., Any] | App, **settings: object) -> None:
        overrides = {**settings, "store": "sqlite", "sqlite_path": ":memory:"}
        self.settings = checked_settings(**overrides, transactional=False)
        self._queues = [_Queue(plan) for plan in plans_for(target, self.settings)]
        self._stack = contextlib.AsyncExitStack()
        self._store: Store | None = None

    async def start(self) -> HandlerKit:
        opened = contextlib.asynccontextmanager(open_backend)(self.settings)
        self._store = store = await self._stack.enter_async_context(opened)
        for queue in self._queues:
            queue.pipeline = Pipeline(
                store=store,
                routes=queue.plan.routes,
                settler=queue.settler,
                config=queue.plan.pipeline,
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
        type: str | None = None,  # the AMQP property's own name
        handler: str | None = None,
    ) -> Verdict:
        """Deliver one message as a producer published it; ``key`` goes where the
        key source looks (a header or the message id; in a body, put it there).

        With an app, the message goes to the queue its routing key is bound to;
        when several handlers' queues are (a fan-out), name the one with ``handler``.
        """
        queue = self._queue_for(routing_key, handler)
        sent_headers = dict(headers or {})
        if key is not None:
            source = queue.plan.routes.default_rules.source
            if source.kind == "header":
                sent_headers[source.name] = key
            elif source.kind == "message_id":
                message_id = key
            else:
                raise ValueError(f"the key is read from the body ({source.name}): put it there")
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        sent = _Sent(
            raw,
            sent_headers,
            message_id=message_id,
            routing_key=routing_key,
            content_type=content_type,
            type=type,
        )
        return await self._deliver(queue, sent)

    def _queue_for(self, routing_key: str, handler: str | None) -> _Queue:
        if handler is not None:
            named = [q for q in self._queues if q.serves(handler)]
            if not named:
                raise ValueError(f"no handler is named {handler!r}")
            return named[0]
        if len(self._queues) == 1:
            return self._queues[0]
        bound = [q for q in self._queues if q.bound_to(routing_key)]
        if len(bound) == 1:
            return bound[0]
        if not bound:
            raise LookupError(
                f"no handler's queue is bound to routing key {routing_key!r}: the broker "
                "would return the message to a mandatory publish (unroutable)"
            )
        names = [route.name for q in bound for route in q.plan.routes.all]
        raise ValueError(
            f"routing key {routing_key!r} reaches the queues of {names}: each gets a copy; "
            "say which one to deliver with handler=..."
        )

    async def send_many(self, bodies: list[Mapping[str, Any]], **options: Any) -> list[Verdict]:
        """Each of ``bodies`` in turn, with the same ``options`` as :meth:`send`."""
        return [await self.send(body, **options) for body in bodies]

    async def redeliver(self, verdict: Verdict) -> Verdict:
        """The copy of ``verdict`` (a retry or a parked copy) delivered again, as its
        delay queue hands it back to the work queue once its wait is over."""
        if verdict.copy is None or verdict.dead_lettered or verdict.queue is None:
            raise ValueError(
                f"a delivery that ended {verdict.outcome.value} has no copy to deliver"
            )
        copy = verdict.copy
        back = returned_copy(_Sent.of(copy.message, copy.exchange, copy.routing_key))
        queue = next(q for q in self._queues if q.plan.worker.queue == verdict.queue)
        return await self._deliver(queue, _Sent.of(back, copy.exchange, copy.routing_key))

    async def _deliver(self, queue: _Queue, message: _Sent) -> Verdict:
        pipeline = queue.pipeline
        if pipeline is None:
            raise RuntimeError("the kit is not started: use it as `async with HandlerKit(...)`")
        copies: list[Published] = []
        _copies.set(copies)  # this delivery's own: sends may run at the same time
        decision = await pipeline.handle(message)
        copied = copies[-1] if copies else None
        return await self._verdict(pipeline, message, decision, copied)

    async def _verdict(
        self, pipeline: Pipeline, message: _Sent, decision: Settle, copied: Published | None
    ) -> Verdict:
        delivery, _ = pipeline.read(message)  # the key and handler, as the pipeline found them
        stored_as, route = delivery.facts.key, delivery.route
        verdict = Verdict(
            key=route.message_key(stored_as) if route and stored_as else stored_as,
            attempt=int(message.headers.get(H_ATTEMPTS, 1)),
            outcome=decision.outcome,
            frame=message.frame,
            error=None
            if decision.outcome is Outcome.COMPLETED
            else getattr(decision, "error", None),
            copy=copied,
            record=await self.store.get(stored_as) if stored_as else None,
            handler=route.name if route else None,
            queue=pipeline.config.queue,
        )
        if isinstance(decision, DeadLetter):
            return replace(verdict, reason=decision.reason)
        if isinstance(decision, Retry) and route is not None:
            tiers = route.retry.delays
            return replace(
                verdict, delay=decision.delay, tier=min(decision.next_attempt - 1, len(tiers))
            )
        return verdict


class SyncHandlerKit:
    """:class:`HandlerKit` for synchronous tests: the same calls, each run to its end
    on an event loop of the kit's own."""

    def __init__(self, target: Callable[..., Any] | App, **settings: object) -> None:
        self._runner = asyncio.Runner()
        self._kit = self._runner.run(HandlerKit(target, **settings).start())

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

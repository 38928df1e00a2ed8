"""Test traffic for a semel deployment: good events, duplicates, concurrent
copies, and every bad input of :mod:`semel.consumer.commands.bad_inputs`.

Building the messages is a pure function (:func:`build_messages`), so what a
run sends can be checked without a broker; :func:`publish_all` then sends them
through :func:`semel.consumer.broker.publishing.publish_confirmed`, keeping a bounded
window of unconfirmed publishes in flight.
"""

from __future__ import annotations

import asyncio
import random
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import orjson
from aio_pika.abc import AbstractExchange

from semel.consumer.broker.publishing import Published, publish_confirmed
from semel.consumer.commands.bad_inputs import BROKEN_BODIES, NOT_AS_MESSAGE_ID, BadKind
from semel.consumer.delivery.message import KeySource
from semel.consumer.errors import PlanError
from semel.consumer.names import JSON_CONTENT_TYPE, MAX_KEY_LENGTH
from semel.stores.base import JSON

PUBLISH_WINDOW = 256  # unconfirmed publishes in flight: fast, yet bounded memory
LONG_KEY_LENGTH = MAX_KEY_LENGTH + 1
MESSAGE_ID_LIMIT = 255  # AMQP short string


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish; a copy or duplicate is the same instance sent again."""

    body: bytes
    headers: dict[str, Any]
    message_id: str | None = None  # None: the client gives every publish its own id
    content_type: str = JSON_CONTENT_TYPE
    key: str | None = None  # the idempotency key it carries, for the report; None: none

    def to_message(self) -> aio_pika.Message:
        # Persistent and mandatory: publish_confirmed sends every message so.
        return aio_pika.Message(
            self.body,
            headers=self.headers,
            message_id=self.message_id,
            content_type=self.content_type,
        )


@dataclass(frozen=True, slots=True)
class PublishPlan:
    """What one ``semel publish`` run sends."""

    count: int = 1
    duplicates: float = 0.0  # fraction of messages sent once more, same key and body
    concurrent_copies: int = 1  # copies of each message sent back to back
    key: str | None = None  # one fixed key for every message
    key_prefix: str = field(default_factory=lambda: f"run-{uuid.uuid4().hex[:8]}")
    body: JSON = None  # None: an order.paid event derived from the key
    bad: tuple[BadKind, ...] = ()


def default_body(key: str) -> dict[str, Any]:
    """An order.paid event for ``semel.consumer.examples:order_paid``; one key, one body."""
    return {
        "event": "order.paid",
        "order_id": key,
        "amount": 100 + zlib.crc32(key.encode()) % 99_900,
        "currency": "EUR",
    }


def _set_path(body: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    inner = body.get(head)
    if rest:
        value = _set_path(dict(inner) if isinstance(inner, dict) else {}, rest, value)
    return body | {head: value}


def _drop_path(body: dict[str, Any], path: str) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    if head not in body:
        return body
    if rest:
        inner = body[head]
        return body | {head: _drop_path(inner, rest)} if isinstance(inner, dict) else body
    return {k: v for k, v in body.items() if k != head}


class _Builder:
    """Turns a key, and a bad kind or none, into the messages that carry them."""

    def __init__(self, plan: PublishPlan, source: KeySource, max_body_bytes: int) -> None:
        self.plan = plan
        self.source = source
        self.max_body_bytes = max_body_bytes

    def body_for(self, key: str) -> JSON:
        return default_body(key) if self.plan.body is None else self.plan.body

    def message(
        self,
        body: JSON,
        key: object,
        *,
        missing: bool = False,
        raw: bytes | None = None,
        content_type: str = JSON_CONTENT_TYPE,
    ) -> Outgoing:
        """Put ``key`` where the consumer reads it; ``raw`` replaces the encoded body."""
        headers: dict[str, Any] = {}
        message_id: str | None = None
        where = self.source
        if where.kind == "header" and not missing:
            headers[where.name] = key
        elif where.kind == "message_id":
            message_id = str(key)
        elif where.kind == "body" and raw is None:
            if not isinstance(body, dict):
                raise PlanError("SEMEL_KEY_SOURCE=body:... needs a JSON object body")
            body = _drop_path(body, where.name) if missing else _set_path(body, where.name, key)
        encoded = orjson.dumps(body) if raw is None else raw
        return Outgoing(encoded, headers, message_id, content_type, None if missing else str(key))

    def good(self, key: str) -> list[Outgoing]:
        return [self.message(self.body_for(key), key)]

    def bad(self, kind: BadKind, key: str, n: int) -> list[Outgoing]:
        if self.source.kind == "message_id" and kind in NOT_AS_MESSAGE_ID:
            raise PlanError(f"--bad {kind} cannot be sent with SEMEL_KEY_SOURCE=message_id")
        body = self.body_for(key)
        if kind in BROKEN_BODIES:
            return [self.message(body, key, raw=BROKEN_BODIES[kind])]
        if kind is BadKind.KEY_REUSE:
            return [self.message(body, key), self.message(self.variant(body), key)]
        if kind is BadKind.JSON_ARRAY:
            # The key stays where a header or message id can carry it; an array has no path.
            return [self.message(body, key, raw=orjson.dumps([body]))]
        if kind is BadKind.TOO_LARGE:
            return [self.message(self.padded(body), key)]
        if kind is BadKind.WRONG_CONTENT_TYPE:
            return [self.message(body, key, content_type="text/plain")]
        bad_key: object = {
            BadKind.EMPTY_KEY: "",
            BadKind.LONG_KEY: (key + "-" + "x" * LONG_KEY_LENGTH)[:LONG_KEY_LENGTH],
            BadKind.NON_PRINTABLE_KEY: f"{key}\x01",
            BadKind.NON_STRING_KEY: n,
        }.get(kind, key)
        return [self.message(body, bad_key, missing=kind is BadKind.MISSING_KEY)]

    @staticmethod
    def variant(body: JSON) -> dict[str, Any]:
        """Another body for the same key: a key reuse."""
        if not isinstance(body, dict):
            raise PlanError("--bad key-reuse needs a JSON object body")
        amount = body.get("amount")
        if isinstance(amount, int):
            return body | {"amount": amount + 1}
        return body | {"variant": 2}

    def padded(self, body: JSON) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise PlanError("--bad too-large needs a JSON object body")
        return body | {"padding": "x" * (self.max_body_bytes + 1)}


def build_messages(
    plan: PublishPlan,
    source: KeySource,
    max_body_bytes: int,
    rng: random.Random | None = None,
) -> list[Outgoing]:
    """Every message of a run, in the order they are to be sent.

    Each logical message is sent ``concurrent_copies`` times back to back; a
    ``duplicates`` fraction of them is sent once more at the end, when most
    keys have completed.
    """
    if plan.count < 1 or plan.concurrent_copies < 1 or not 0.0 <= plan.duplicates <= 1.0:
        raise PlanError("--count and --concurrent-copies must be >= 1, --duplicates in 0..1")
    if source.kind == "message_id" and len(plan.key or "") > MESSAGE_ID_LIMIT:
        raise PlanError(f"a message id holds at most {MESSAGE_ID_LIMIT} characters")
    builder = _Builder(plan, source, max_body_bytes)
    originals: list[Outgoing] = []
    for n in range(1, plan.count + 1):
        if not plan.bad:
            originals += builder.good(plan.key or f"{plan.key_prefix}-{n}")
        for kind in plan.bad:
            originals += builder.bad(kind, plan.key or f"{plan.key_prefix}-{kind}-{n}", n)
    sent = [message for message in originals for _ in range(plan.concurrent_copies)]
    picked = (rng or random.Random()).sample(originals, round(len(originals) * plan.duplicates))
    return sent + picked


@dataclass(slots=True)
class PublishReport:
    """What the broker said about a run's publishes: every message has one outcome.

    ``published`` = ``confirmed`` + ``returned`` + ``nacked`` + ``failed``;
    ``not_sent`` are the messages after the first failure, never published.
    """

    published: int = 0
    confirmed: int = 0
    returned: int = 0  # unroutable: no queue bound for the routing key
    nacked: int = 0  # the broker refused to take responsibility
    # Published without an answer (the connection was lost, the confirm never
    # came): in the queue or not, nobody knows. Their keys, so they can be sent again.
    failed: int = 0
    not_sent: int = 0
    failed_keys: list[str] = field(default_factory=list)
    error: str | None = None  # why the first publish failed

    def count(self, answer: Published) -> None:
        if answer is Published.CONFIRMED:
            self.confirmed += 1
        elif answer is Published.RETURNED:
            self.returned += 1
        else:
            self.nacked += 1

    def count_failed(self, message: Outgoing, error: Exception) -> None:
        self.failed += 1
        if message.key is not None:
            self.failed_keys.append(message.key)
        if self.error is None:
            self.error = f"{type(error).__name__}: {error}".rstrip(": ")

    @property
    def ok(self) -> bool:
        return self.returned == self.nacked == self.failed == self.not_sent == 0

    def summary(self) -> str:
        text = (
            f"published {self.published}, confirmed {self.confirmed}, "
            f"returned {self.returned}, nacked {self.nacked}"
        )
        if self.failed or self.not_sent:
            text += f", failed {self.failed} (no answer), not sent {self.not_sent}"
        return text


class _Window:
    """A bounded set of unconfirmed publishes, settled into one report."""

    def __init__(self, exchange: AbstractExchange, routing_key: str, size: int) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.report = PublishReport()
        self.slots = asyncio.Semaphore(size)
        self.pending: set[asyncio.Task[None]] = set()
        # The client matches a returned message to its publish by message id,
        # so two publishes sharing an id (the key as message id) never overlap.
        self.by_id: dict[str, asyncio.Task[None]] = {}
        self.failing = False  # a publish got no answer: send nothing more

    async def submit(self, message: Outgoing, on_settled: Callable[[], None]) -> bool:
        """Start one publish once a slot is free; ``False`` after a failure."""
        earlier = self.by_id.get(message.message_id or "")
        if earlier is not None:
            await asyncio.wait([earlier])
        await self.slots.acquire()
        if self.failing:
            self.slots.release()
            return False
        task = asyncio.create_task(self._send(message, on_settled))
        self.report.published += 1
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)
        if message.message_id is not None:
            self.by_id[message.message_id] = task
        return True

    async def _send(self, message: Outgoing, on_settled: Callable[[], None]) -> None:
        try:
            answer = await publish_confirmed(self.exchange, message.to_message(), self.routing_key)
        except Exception as exc:  # no answer: counted, and the run stops
            self.failing = True
            self.report.count_failed(message, exc)
        else:
            self.report.count(answer)
        finally:
            self.slots.release()
            on_settled()

    async def drain(self) -> PublishReport:
        if self.pending:
            await asyncio.wait(self.pending)
        return self.report


async def publish_all(
    exchange: AbstractExchange,
    messages: Sequence[Outgoing],
    routing_key: str,
    *,
    rate: float = 0.0,
    window: int = PUBLISH_WINDOW,
    on_settled: Callable[[], None] = lambda: None,
) -> PublishReport:
    """Publish ``messages`` in order, confirmed and mandatory; count the outcomes.

    ``rate`` caps messages per second (0: as fast as confirms allow). A
    publish that gets no answer (connection lost, channel closed, confirm
    timeout) stops the run: the publishes in flight settle, each confirmed
    or counted failed, and the rest are counted not sent. Nothing is left
    without an outcome, so nothing confirmed-looking can be silently lost.
    """
    in_flight = _Window(exchange, routing_key, window)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for index, message in enumerate(messages):
        if rate > 0:
            await asyncio.sleep(max(0.0, started + index / rate - loop.time()))
        if not await in_flight.submit(message, on_settled):
            break
    report = await in_flight.drain()
    report.not_sent = len(messages) - report.published
    return report

"""Test traffic for a semel deployment: good events, duplicates, concurrent
copies, and every bad input of :mod:`semel.consumer.commands.bad_inputs`.

Building the messages is a pure function (:func:`build_messages`), so what a
run sends can be checked without a broker; a good message carries its key as
:func:`~semel.consumer.producer.envelope.envelope` places it, a bad one as its
kind needs. :func:`publish_all` then sends them through the
:class:`~semel.consumer.producer.Publisher`'s batch (in order, a bounded window
of unconfirmed publishes, no retry: a run reports what the broker said to
each message once) and counts the receipts.
"""

from __future__ import annotations

import random
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aio_pika.abc import AbstractExchange

from semel.consumer.commands.bad_inputs import BROKEN_BODIES, NOT_AS_MESSAGE_ID, BadKind
from semel.consumer.delivery.message import KeySource, validate_key
from semel.consumer.errors import BadMessage, PlanError
from semel.consumer.names import JSON_CONTENT_TYPE, MAX_KEY_LENGTH
from semel.consumer.producer import (
    NO_RETRY,
    PUBLISH_WINDOW,
    Answer,
    Envelope,
    Prepared,
    Publisher,
    Receipt,
)
from semel.consumer.producer.envelope import envelope, with_path
from semel.consumer.producer.receipt import NO_ANSWER
from semel.stores.base import JSON

LONG_KEY_LENGTH = MAX_KEY_LENGTH + 1
MESSAGE_ID_LIMIT = 255  # AMQP short string


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish; a copy or duplicate is the same instance sent again."""

    body: bytes
    headers: dict[str, Any]
    message_id: str | None = None  # None: the publisher gives every publish its own id
    content_type: str = JSON_CONTENT_TYPE
    key: str | None = None  # the idempotency key it carries, for the report; None: none

    def prepared(self, routing_key: str) -> Prepared:
        sealed = Envelope(self.body, self.headers, self.message_id, self.content_type)
        return Prepared(sealed, routing_key, self.key or "")


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
            body = _drop_path(body, where.name) if missing else with_path(body, where.name, key)
        encoded = orjson.dumps(body) if raw is None else raw
        return Outgoing(encoded, headers, message_id, content_type, None if missing else str(key))

    def good(self, key: str) -> list[Outgoing]:
        body = self.body_for(key)
        try:
            validate_key(key, "--key")
        except BadMessage:  # sent as given: the consumer dead-letters it, as it would --bad's
            return [self.message(body, key)]
        try:
            sealed = envelope(self.source, key, body)
        except (ValueError, TypeError) as exc:
            raise PlanError(str(exc)) from None
        content_type = sealed.content_type or JSON_CONTENT_TYPE
        return [Outgoing(sealed.body, sealed.headers, sealed.message_id, content_type, key)]

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

    def count(self, message: Outgoing, receipt: Receipt) -> None:
        """Count one message's receipt."""
        if receipt.attempts == 0:
            self.not_sent += 1
            return
        self.published += 1
        if receipt.answer in NO_ANSWER:
            self.failed += 1
            if message.key is not None:
                self.failed_keys.append(message.key)
            if self.error is None:
                self.error = receipt.error
        elif receipt.answer is Answer.CONFIRMED:
            self.confirmed += 1
        elif receipt.answer is Answer.RETURNED:
            self.returned += 1
        else:
            self.nacked += 1

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
    publisher = Publisher(exchange, retry=NO_RETRY, window=window)
    prepared = [message.prepared(routing_key) for message in messages]
    receipts = await publisher.publish_prepared(prepared, rate=rate, on_settled=on_settled)
    report = PublishReport()
    for message, receipt in zip(messages, receipts, strict=True):
        report.count(message, receipt)
    return report

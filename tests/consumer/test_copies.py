"""The retry copies and dead letters semel publishes (pure, no servers)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, cast

import aio_pika
from aio_pika.message import IncomingMessage
from aiormq.abc import AbstractChannel, DeliveredMessage
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from semel.consumer.broker.copies import dead_letter_copy, parked_copy, retry_copy, returned_copy
from semel.consumer.delivery.decide import DeadLetter, Retry, bounded
from semel.consumer.delivery.facts import Facts, Origin, first_seen
from semel.consumer.names import (
    BROKER_HEADERS,
    ERROR_HEADER_LIMIT,
    H_ATTEMPTS,
    H_DEAD_LETTERED_AT,
    H_ERROR,
    H_FIRST_SEEN,
    H_KEY,
    H_ORIGINAL_EXCHANGE,
    H_ORIGINAL_ROUTING_KEY,
    H_PARKED_AT,
    H_REASON,
    Reason,
)

FACTS = Facts(
    key="k-1",
    attempt=2,
    origin=Origin("events", "order.paid"),
    first_seen="2026-01-01T00:00:00.000+00:00",
)


def incoming(headers: dict[str, Any], **properties: Any) -> IncomingMessage:
    props = Basic.Properties(headers=headers, **properties)
    delivered = DeliveredMessage(
        delivery=Basic.Deliver(
            consumer_tag="c", delivery_tag=1, redelivered=False, exchange="", routing_key="q"
        ),
        header=ContentHeader(properties=props),
        body=b'{"a":1}',
        channel=cast(AbstractChannel, None),
    )
    return IncomingMessage(delivered)


BROKER_WRITTEN = {name: "x" for name in BROKER_HEADERS} | {"x-death": [{"count": 3}]}


def test_a_retry_copy_counts_the_attempt_and_drops_broker_headers() -> None:
    message = incoming(
        {"Idempotency-Key": "k-1", "trace": "t1", **BROKER_WRITTEN},
        content_type="application/json",
        message_id="m-1",
        correlation_id="c-1",
        expiration="60000",
        user_id="someone-else",
        app_id="shop",
    )
    before = int(time.time() * 1000)
    copy = retry_copy(message, FACTS, Retry(delay=5, next_attempt=3, error="E: x"))
    headers = dict(copy.headers)
    assert before <= cast(int, headers.pop(H_PARKED_AT)) <= int(time.time() * 1000)
    assert headers == {
        "Idempotency-Key": "k-1",
        "trace": "t1",
        H_ATTEMPTS: 3,
        H_FIRST_SEEN: FACTS.first_seen,
        H_ORIGINAL_EXCHANGE: "events",
        H_ORIGINAL_ROUTING_KEY: "order.paid",
    }
    assert copy.body == b'{"a":1}'
    assert (copy.content_type, copy.message_id, copy.correlation_id, copy.app_id) == (
        "application/json", "m-1", "c-1", "shop"
    )  # fmt: skip
    assert copy.delivery_mode is aio_pika.DeliveryMode.PERSISTENT
    assert copy.expiration is None  # a per-message TTL could drop the waiting copy
    assert copy.user_id is None


def test_a_dead_letter_says_why() -> None:
    message = incoming({"Idempotency-Key": "k-1", **BROKER_WRITTEN})
    letter = dead_letter_copy(message, FACTS, DeadLetter(Reason.MAX_ATTEMPTS, "RuntimeError: x"))
    headers = letter.headers
    assert headers.keys().isdisjoint(BROKER_HEADERS)
    assert headers[H_REASON] == "max-attempts"
    assert headers[H_ERROR] == "RuntimeError: x"
    assert headers[H_ATTEMPTS] == 2
    assert headers[H_KEY] == "k-1"
    assert (headers[H_ORIGINAL_EXCHANGE], headers[H_ORIGINAL_ROUTING_KEY]) == (
        "events", "order.paid"
    )  # fmt: skip
    assert headers[H_FIRST_SEEN] == FACTS.first_seen
    dead_at_text = headers[H_DEAD_LETTERED_AT]
    assert isinstance(dead_at_text, str)
    dead_at = datetime.fromisoformat(dead_at_text)
    assert abs((datetime.now(UTC) - dead_at).total_seconds()) < 60


def test_errors_are_bounded_without_splitting_a_character() -> None:
    error = "é" * ERROR_HEADER_LIMIT
    kept = bounded(error)
    assert len(kept.encode()) <= ERROR_HEADER_LIMIT
    assert kept == "é" * (ERROR_HEADER_LIMIT // 2)
    message = incoming({})
    letter = dead_letter_copy(message, FACTS, DeadLetter(Reason.PERMANENT_ERROR, error))
    assert letter.headers[H_ERROR] == kept


def test_an_unknown_key_is_an_empty_header() -> None:
    letter = dead_letter_copy(
        incoming({}), Facts(None, 1, Origin("e", "r"), "t"), DeadLetter(Reason.MISSING_KEY, "x")
    )
    assert letter.headers[H_KEY] == ""


def test_first_seen_survives_retries() -> None:
    assert first_seen({H_FIRST_SEEN: FACTS.first_seen}) == FACTS.first_seen
    assert datetime.fromisoformat(first_seen({})) <= datetime.now(UTC)


def test_now_iso_is_isoformat_to_the_millisecond() -> None:
    from datetime import UTC, datetime

    from semel.consumer.delivery.facts import now_iso

    for _ in range(3):
        before = datetime.now(UTC).replace(microsecond=datetime.now(UTC).microsecond // 1000 * 1000)
        text = now_iso()
        parsed = datetime.fromisoformat(text)
        assert text == parsed.isoformat(timespec="milliseconds")
        assert parsed.tzinfo is not None
        assert abs((parsed - before).total_seconds()) < 1


def test_a_parked_copy_is_stamped_and_its_return_to_q_is_not() -> None:
    message = incoming({"Idempotency-Key": "k-1", "trace": "t1", **BROKER_WRITTEN})
    parked = parked_copy(message, "q")
    route = {H_ORIGINAL_EXCHANGE: "", H_ORIGINAL_ROUTING_KEY: "q"}  # as delivered
    assert parked.headers.keys() == {"Idempotency-Key", "trace", H_PARKED_AT, H_FIRST_SEEN, *route}
    returned = returned_copy(incoming(dict(parked.headers)))
    back = dict(returned.headers)
    assert back.pop(H_FIRST_SEEN) == parked.headers[H_FIRST_SEEN]
    assert back == {"Idempotency-Key": "k-1", "trace": "t1"} | route
    assert returned.delivery_mode is aio_pika.DeliveryMode.PERSISTENT

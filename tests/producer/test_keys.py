"""The key goes where each ``SEMEL_KEY_SOURCE`` says, and semel's own reader finds it."""

from __future__ import annotations

import pytest

from semel.consumer.delivery.message import KeySource
from semel.consumer.producer import Publisher
from tests.producer.conftest import ROUTING_KEY, Place, body_of

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    "source", ["header:Idempotency-Key", "header:X-Order-Key", "message_id", "body:meta.key"]
)
async def test_the_key_is_read_back_by_the_consumers_key_source(place: Place, source: str) -> None:
    body = {"order": 42, "meta": {"tenant": "t-1"}}
    async with Publisher.connect(place.url, exchange=place.exchange, key_source=source) as pub:
        receipt = await pub.publish(body, key="order-42", routing_key=ROUTING_KEY)
    assert receipt.ok
    (message,) = await place.taken(1)
    read = KeySource.parse(source).extract(message.headers, message.message_id, body_of(message))
    assert read == "order-42"
    assert message.message_id == receipt.message_id
    if source == "message_id":
        assert receipt.message_id == "order-42"
    if source == "body:meta.key":
        assert body_of(message) == {"order": 42, "meta": {"tenant": "t-1", "key": "order-42"}}


@pytest.mark.parametrize(
    ("source", "key", "body", "complaint"),
    [
        ("header:Idempotency-Key", "", {"a": 1}, "0 characters"),
        ("header:Idempotency-Key", "x" * 257, {"a": 1}, "257 characters"),
        ("header:Idempotency-Key", "bad\x01key", {"a": 1}, "non-printable"),
        ("body:id", "k-1", [1, 2], "needs a JSON object body"),
        ("body:id", "k-1", b"{}", "needs a JSON object body"),
    ],
)
async def test_a_key_the_consumer_would_refuse_is_refused_before_anything_is_sent(
    place: Place, source: str, key: str, body: object, complaint: str
) -> None:
    async with Publisher.connect(place.url, exchange=place.exchange, key_source=source) as pub:
        with pytest.raises(ValueError, match=complaint):
            await pub.publish(body, key=key, routing_key=ROUTING_KEY)
    assert await place.depth() == 0

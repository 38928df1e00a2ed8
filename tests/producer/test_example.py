"""examples/fastapi_publish.py against the real broker, through httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from aio_pika.abc import AbstractConnection

from examples import fastapi_publish as example
from semel.consumer.delivery.message import KeySource
from tests.producer.conftest import Place, body_of

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def client(monkeypatch: pytest.MonkeyPatch, place: Place) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setenv("SEMEL_AMQP_URL", place.url)
    monkeypatch.setenv("SEMEL_EXCHANGE", place.exchange)
    # httpx's transport runs no lifespan: the test runs it, as uvicorn would.
    async with example.app.router.lifespan_context(example.app):
        transport = httpx.ASGITransport(app=example.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
            yield client


async def test_a_confirmed_event_is_202_with_its_receipt(
    client: httpx.AsyncClient, place: Place
) -> None:
    key = f"paid-{uuid.uuid4().hex}"
    response = await client.post(
        "/orders/o-1/paid", json={"amount": 1250}, headers={"Idempotency-Key": key}
    )
    assert response.status_code == 202, response.text
    receipt = response.json()
    assert receipt["answer"] == "confirmed"
    assert receipt["key"] == key
    assert receipt["attempts"] == 1
    (message,) = await place.taken(1)
    source = KeySource.parse("header:Idempotency-Key")
    assert source.extract(message.headers, message.message_id, body_of(message)) == key
    assert message.message_id == receipt["message_id"]
    assert body_of(message) == {
        "event": "order.paid",
        "order_id": "o-1",
        "amount": 1250,
        "currency": "EUR",
    }


async def test_an_event_no_queue_takes_is_503(
    client: httpx.AsyncClient, place: Place, observer: AbstractConnection
) -> None:
    channel = await observer.channel()
    queue = await channel.declare_queue(place.queue, passive=True)
    await queue.unbind(place.exchange, "#")  # nobody listens now
    response = await client.post(
        "/orders/o-2/paid", json={"amount": 5}, headers={"Idempotency-Key": "paid-o-2"}
    )
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
    assert response.json()["answer"] == "returned"


async def test_a_key_the_consumer_would_refuse_is_422(
    client: httpx.AsyncClient, place: Place
) -> None:
    response = await client.post(
        "/orders/o-3/paid", json={"amount": 5}, headers={"Idempotency-Key": "x" * 300}
    )
    assert response.status_code == 422
    assert "300 characters" in response.json()["detail"]
    assert await place.depth() == 0


async def test_the_sync_sample_publishes_from_a_thread(
    monkeypatch: pytest.MonkeyPatch, place: Place
) -> None:
    monkeypatch.setenv("SEMEL_AMQP_URL", place.url)
    monkeypatch.setenv("SEMEL_EXCHANGE", place.exchange)
    message_id = await asyncio.to_thread(example.publish_refund, "o-4", 300)
    (message,) = await place.taken(1)
    assert message.message_id == message_id
    assert message.headers == {"Idempotency-Key": "refund-o-4"}

"""Publishing to semel from a producer in Python, as the README shows: the key in
the ``Idempotency-Key`` header, persistent delivery, ``mandatory`` and publisher
confirms. Run by tests/testing/test_example.py against the real broker."""

from __future__ import annotations

import json

import aio_pika


# --8<-- [start:publish]
async def publish_order_paid(
    url: str, order_id: str, amount: int, exchange_name: str = "semel.events"
) -> None:
    connection = await aio_pika.connect_robust(url)
    async with connection:
        # Confirms: publish() returns once the broker has the message, and raises
        # if it was returned (mandatory, no queue bound) or nacked.
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.get_exchange(exchange_name)
        message = aio_pika.Message(
            json.dumps({"order_id": order_id, "amount": amount}).encode(),
            content_type="application/json",
            headers={"Idempotency-Key": f"order-paid-{order_id}"},  # same key on every retry
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,  # kept across a broker restart
        )
        # mandatory: a routing key no queue is bound to comes back instead of vanishing.
        await exchange.publish(message, routing_key="orders.paid", mandatory=True)


# --8<-- [end:publish]

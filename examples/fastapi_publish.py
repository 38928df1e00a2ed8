"""An endpoint that publishes an event under the client's ``Idempotency-Key``.

``POST /orders/{order_id}/paid`` publishes an ``order.paid`` event for semel's
consumers, the client's key placed where ``SEMEL_KEY_SOURCE`` says they read
it, and answers 202 with the receipt once the broker confirmed it, 503 (with
``Retry-After``) when it did not: the client sends the same request again,
with the same key, and the consumer runs the key once whatever arrives twice.
The publisher opens with the application (its lifespan), from ``SEMEL_*``::

    SEMEL_AMQP_URL=amqp://guest:guest@localhost:5672/ SEMEL_EXCHANGE=semel.events \\
        uvicorn examples.fastapi_publish:app
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from semel import Publisher, SyncPublisher


# --8<-- [start:lifespan]
@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # One connection for the process: SEMEL_AMQP_URL, SEMEL_EXCHANGE, SEMEL_KEY_SOURCE.
    async with Publisher.open() as publisher:
        app.state.publisher = publisher
        yield


app = FastAPI(lifespan=lifespan)
# --8<-- [end:lifespan]


# --8<-- [start:publish]
class Payment(BaseModel):
    amount: int  # in cents
    currency: str = "EUR"


@app.post("/orders/{order_id}/paid", status_code=202)
async def order_paid(
    order_id: str,
    payment: Payment,
    request: Request,
    idempotency_key: Annotated[str, Header()],
) -> JSONResponse:
    publisher: Publisher = request.app.state.publisher
    event = {"event": "order.paid", "order_id": order_id, **payment.model_dump()}
    try:
        receipt = await publisher.publish(event, key=idempotency_key, routing_key="order.paid")
    except ValueError as exc:  # a key the consumer would refuse: the client's to fix
        raise HTTPException(422, str(exc)) from None
    answer: dict[str, Any] = {
        "message_id": receipt.message_id,
        "key": receipt.key,
        "answer": receipt.answer,
        "attempts": receipt.attempts,
    }
    if not receipt.ok:  # returned, nacked, timed out or failed: not the broker's yet
        return JSONResponse(answer, status_code=503, headers={"Retry-After": "5"})
    return JSONResponse(answer, status_code=202)


# --8<-- [end:publish]


# --8<-- [start:sync]
def publish_refund(order_id: str, amount: int) -> str:
    """The same from sync code (a Django view, a Flask handler, a script)."""
    with SyncPublisher.open() as publisher:  # a process keeps one open; close() at exit
        receipt = publisher.publish(
            {"event": "order.refunded", "order_id": order_id, "amount": amount},
            key=f"refund-{order_id}",
            routing_key="order.refunded",
        )
    if not receipt.ok:
        raise RuntimeError(f"refund of {order_id} not confirmed: {receipt.answer}")
    return receipt.message_id


# --8<-- [end:sync]

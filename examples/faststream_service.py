"""A FastStream service whose subscriber runs once per idempotency key (docs/faststream.md).

Run it with ``python examples/faststream_service.py``; semel reads ``SEMEL_*``
from the environment as the worker does (``SEMEL_STORE=redis``,
``SEMEL_REDIS_URL``, ``SEMEL_AMQP_URL``...). ``tests/embedded/test_examples.py``
runs it against the real broker.
"""

from __future__ import annotations

# --8<-- [start:service]
import asyncio
import logging

from faststream import Context, FastStream
from faststream.rabbit import RabbitBroker, RabbitQueue
from pydantic import BaseModel

import semel
from semel import PermanentError, Semel

engine = Semel()  # SEMEL_* from the environment; or Semel(store="redis", ...)
broker = RabbitBroker(engine.settings.amqp_url, middlewares=[engine.faststream()])
app = FastStream(broker)
log = logging.getLogger("orders")


class OrderPaid(BaseModel):
    order_id: str
    amount: int


@broker.subscriber(RabbitQueue(engine.settings.queue, durable=True, routing_key="orders.paid"))
async def charge(order: OrderPaid, run: semel.Context = Context("semel")) -> dict[str, str]:
    if order.amount <= 0:
        raise PermanentError("nothing to charge")  # to the DLQ, never retried
    # run.key, run.fence and run.attempt: the delivery's idempotency key, the
    # claim's fence (hand it to fenced writes) and which attempt this is.
    log.info("charged order %s: %s (key %s)", order.order_id, order.amount, run.key)
    return {"charged": order.order_id}  # stored with the key; a duplicate's reply


@app.on_startup
async def open_semel() -> None:
    await engine.start()  # a bad setting or an unreachable store stops start-up here


@app.after_startup
async def declare_semel_queues() -> None:
    await engine.door(engine.settings.queue)  # retry tiers, conflict queue, DLQ
    semel.tune_gc()  # the collector set for hundreds of deliveries in flight


@app.after_shutdown
async def close_semel() -> None:
    await engine.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(app.run())
# --8<-- [end:service]

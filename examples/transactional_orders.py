"""An example handler for transactional mode: a payment recorded exactly once.

Run it against a local PostgreSQL and RabbitMQ::

    export SEMEL_STORE=postgres SEMEL_TRANSACTIONAL=true
    export SEMEL_POSTGRES_DSN=postgresql://localhost/shop
    export SEMEL_HANDLER=examples.transactional_orders:order_paid
    semel migrate                        # the key table and the outbox table
    psql "$SEMEL_POSTGRES_DSN" -c "$(python -c \
        'import examples.transactional_orders as e; print(e.SCHEMA)')"
    semel consume

For each ``order.paid`` event the payment row, the order's new status and the
``order.ready-to-ship`` message commit in one transaction, together with the
completion of the event's idempotency key: a redelivered or duplicate event
writes nothing and sends nothing; a worker killed half-way leaves nothing
behind, and the event runs again from scratch. The message is published after
the commit, with a message id (also its ``Idempotency-Key``) that stays the
same if the relay has to send it again, so the shipping service can drop a
repeat.
"""

from __future__ import annotations

import os
from typing import Any

from semel.consumer import PermanentError
from semel.consumer.transactional import TransactionalContext

SCHEMA = """
CREATE TABLE IF NOT EXISTS example_orders (
    order_id text PRIMARY KEY,
    status   text NOT NULL DEFAULT 'open'
);
CREATE TABLE IF NOT EXISTS example_payments (
    id              bigserial PRIMARY KEY,
    order_id        text   NOT NULL REFERENCES example_orders (order_id),
    amount          bigint NOT NULL,
    currency        text   NOT NULL,
    idempotency_key text   NOT NULL,
    fence           bigint NOT NULL
);
"""


# --8<-- [start:handler]
async def order_paid(context: TransactionalContext) -> dict[str, Any]:
    """Record the payment, mark the order paid, ask shipping to ship it."""
    body = context.body
    order_id = body.get("order_id")
    amount = body.get("amount")
    if not isinstance(order_id, str) or not order_id:
        raise PermanentError("order.paid event without an order_id")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise PermanentError(f"order {order_id}: amount must be a positive integer")
    currency = body.get("currency", "EUR")

    db = context.db  # inside the delivery's transaction: semel commits it
    await db.execute(
        "INSERT INTO example_orders (order_id, status) VALUES (%s, 'paid')"
        " ON CONFLICT (order_id) DO UPDATE SET status = 'paid'",
        (order_id,),
    )
    await db.execute(
        "INSERT INTO example_payments (order_id, amount, currency, idempotency_key, fence)"
        " VALUES (%s, %s, %s, %s, %s)",
        (order_id, amount, currency, context.key, context.fence),
    )
    message_id = context.publish(
        os.environ.get("EXAMPLE_SHIPPING_EXCHANGE", "shipping"),
        "order.ready-to-ship",
        {"order_id": order_id},
    )
    # Stored with the key: what a duplicate of this event is answered with.
    return {"order_id": order_id, "status": "paid", "shipping_message": message_id}


# --8<-- [end:handler]

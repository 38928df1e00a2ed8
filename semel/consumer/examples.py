"""The bundled example handler, the default ``SEMEL_HANDLER``.

It handles an ``order.paid``-style event such as::

    {"order_id": "A-1001", "amount": 4200, "currency": "EUR"}

and shows the handler contract: validate, do the work once, return a small
JSON result that is stored with the key. A real handler would pass
``context.fence`` to the downstream system so a stale worker's write is refused.
Its log line needs no key of its own: semel binds the delivery's key, fence,
attempt, message id and routing key to every line a handler writes.
"""

from __future__ import annotations

from typing import Any

import structlog

from semel.consumer import Context, PermanentError

log = structlog.get_logger("semel.example")


def order_paid(context: Context) -> dict[str, Any]:
    """Record a paid order; a missing order id or a bad amount can never succeed."""
    body = context.body
    order_id = body.get("order_id")
    if not isinstance(order_id, str) or not order_id:
        raise PermanentError("order.paid event without an order_id")
    amount = body.get("amount", 0)
    if not isinstance(amount, int | float) or isinstance(amount, bool) or amount < 0:
        raise PermanentError(f"order {order_id}: amount must be a non-negative number")
    currency = body.get("currency", "EUR")
    log.info("order recorded")  # no body field: a body never reaches an info line
    return {"order_id": order_id, "amount": amount, "currency": currency, "status": "recorded"}

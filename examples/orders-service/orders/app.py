"""The service's handlers: ``charge`` takes ``orders.paid`` events, ``ship`` takes
``orders.<region>.packed`` ones. semel runs each once per idempotency key, each on
a queue of its own (``semel.work.charge``, ``semel.work.ship``)."""

from __future__ import annotations

import logging

from pydantic import BaseModel, Field

from semel.consumer import App, Context, PermanentError

log = logging.getLogger(__name__)

# --8<-- [start:app]
app = App()
# --8<-- [end:app]


# --8<-- [start:typed]
class OrderPaid(BaseModel):
    order_id: str
    amount: int = Field(gt=0)  # cents
    currency: str = "EUR"


class Charged(BaseModel):
    order_id: str
    charged: int


@app.handler("orders.paid")
async def charge(order: OrderPaid, ctx: Context) -> Charged:
    """An ``async def`` with a typed body: a body that does not validate never gets here
    (it is dead-lettered as ``invalid-body``)."""
    # A real service would call its payment provider here, passing ctx.key as the
    # provider's idempotency key and ctx.fence where it can refuse a stale writer.
    log.info("charged order %s: %d %s", order.order_id, order.amount, order.currency)
    return Charged(order_id=order.order_id, charged=order.amount)


# --8<-- [end:typed]


# --8<-- [start:ship]
@app.handler("orders.*.packed", max_attempts=3, retry_delays=[2, 10])
def ship(ctx: Context) -> dict[str, str]:
    """A plain ``def`` (run on a thread of its own) with its own attempts and back-off."""
    address = ctx.body.get("address")
    if not address:
        raise PermanentError("no address to ship to")  # straight to the DLQ, never retried
    region = ctx.routing_key.split(".")[1]
    log.info("shipped order %s to %s (%s)", ctx.key, address, region)
    return {"shipped_to": address, "region": region}


# --8<-- [end:ship]

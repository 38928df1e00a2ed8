"""The handlers the docs show ("Writing a handler"), run by tests/testing/test_example.py.

``psp`` stands in for a payment provider's client, so the handler runs as written.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from semel.consumer import Context, PermanentError


@dataclass(frozen=True)
class Payment:
    id: str


class PaymentProvider:
    """A payment provider that refuses nothing and remembers each idempotency key."""

    def __init__(self) -> None:
        self.charges: dict[str, Payment] = {}
        self._ids = itertools.count(1)

    async def charge(self, amount: int, *, idempotency_key: str, fence: int) -> Payment:
        if idempotency_key not in self.charges:
            self.charges[idempotency_key] = Payment(f"pay-{next(self._ids)}")
        return self.charges[idempotency_key]


psp = PaymentProvider()


# --8<-- [start:charge]
async def charge(ctx: Context) -> dict[str, str]:
    if "amount" not in ctx.body:
        raise PermanentError("no amount")  # never retried: straight to the DLQ
    payment = await psp.charge(ctx.body["amount"], idempotency_key=ctx.key, fence=ctx.fence)
    return {"payment_id": payment.id}  # stored with the key, JSON


# --8<-- [end:charge]

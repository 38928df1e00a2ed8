"""A payments endpoint that charges once per client ``Idempotency-Key``.

``POST /payments`` charges the body's amount once per key: the same request
again gets the stored receipt (``"replayed": true``), a copy sent while the
first is still running gets 409 with ``Retry-After``, and the key sent with
another body gets 422. The key's state lives in Redis::

    SEMEL_REDIS_URL=redis://127.0.0.1:6379/0 uvicorn examples.fastapi_idempotency:app

The store opens with the application (its lifespan), or at the first call.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import FastAPI, Header, HTTPException
from pydantic import BaseModel

from semel import Semel
from semel.consumer.idempotent import Duplicate, PayloadMismatch, RetryLater

# --8<-- [start:store]
# The Redis store from SEMEL_REDIS_URL (or REDIS_URL); settings given here win.
engine = Semel(store="redis", key_prefix="payments")
# --8<-- [end:store]


@dataclass
class Psp:
    """Stands in for a payment provider: it takes the key, and the fence to refuse a
    stale writer with; ``charges`` is every charge it made."""

    charges: list[tuple[str, int, int]] = field(default_factory=list)

    async def charge(self, key: str, amount: int, *, fence: int) -> str:
        self.charges.append((key, amount, fence))
        return f"pay_{uuid.uuid4().hex[:12]}"


psp = Psp()


# --8<-- [start:charge]
class Payment(BaseModel):
    amount: int  # in cents
    currency: str = "EUR"


class Receipt(BaseModel):
    payment_id: str
    amount: int
    currency: str
    replayed: bool = False


def replayed(receipt: Receipt, _: Duplicate) -> Receipt:
    """A duplicate's answer: the stored receipt, marked as a replay."""
    return receipt.model_copy(update={"replayed": True})


@engine.idempotent(
    key="idempotency_key",
    in_progress="retry_later",  # a copy of a running request: 409, come back later
    on_duplicate=replayed,
    local_cache=1024,  # repeats of recent keys are answered without Redis
    scope="payments",  # pinned: renaming the function must not forget its keys
)
async def charge(idempotency_key: str, payment: Payment, *, fence: int = 0) -> Receipt:
    payment_id = await psp.charge(idempotency_key, payment.amount, fence=fence)
    return Receipt(payment_id=payment_id, amount=payment.amount, currency=payment.currency)


# --8<-- [end:charge]


@contextlib.asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    async with engine:  # opens the store; a bad setting or no Redis stops start-up
        yield


app = FastAPI(lifespan=lifespan)


# --8<-- [start:endpoint]
@app.post("/payments", status_code=201)
async def create_payment(payment: Payment, idempotency_key: Annotated[str, Header()]) -> Receipt:
    try:
        return await charge(idempotency_key, payment)
    except RetryLater as busy:
        retry_after = str(max(1, math.ceil(busy.retry_after)))
        raise HTTPException(
            409, "a request with this Idempotency-Key is in progress", {"Retry-After": retry_after}
        ) from None
    except PayloadMismatch:
        raise HTTPException(422, "this Idempotency-Key was used with another body") from None


# --8<-- [end:endpoint]

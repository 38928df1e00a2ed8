"""Testing a handler with semel's kit: the README's "Testing your handlers" example,
run by tests/testing/test_example.py."""

from __future__ import annotations

import pydantic

from semel.consumer import PermanentError
from semel.consumer.testing import HandlerKit


class OrderPaid(pydantic.BaseModel):
    order_id: str
    amount: int


async def charge(order: OrderPaid) -> dict[str, int]:
    if order.amount < 0:
        raise PermanentError("a negative amount is never charged")
    return {"charged": order.amount}


# --8<-- [start:test]
async def test_charge() -> None:
    async with HandlerKit(charge, key_source="body:order_id") as kit:
        first = await kit.send({"order_id": "o-1", "amount": 5})
        assert first.acked
        assert first.stored == {"charged": 5}
        again = await kit.send({"order_id": "o-1", "amount": 5})
        assert again.duplicate  # answered from the store, charge() not run
        bad = await kit.send({"order_id": "o-2", "amount": "five"})
        assert bad.dead_lettered
        assert bad.reason == "invalid-body"
        assert "x-semel-validation-errors" in bad.headers


# --8<-- [end:test]

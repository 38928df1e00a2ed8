"""Handlers returning values that are not JSON as they are, as
``tests.consumer.result_handlers:<name>``; each records its run in the ledger."""

from __future__ import annotations

import dataclasses
import enum
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import pydantic

from semel.consumer import Context
from tests.consumer.handlers import record

ORDER_ID = UUID("6f1c1b0e-2d5e-4c33-9a57-3c8f3f1b9b10")
PAID_AT = datetime(2026, 11, 27, 1, 30, tzinfo=UTC)


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Receipt(pydantic.BaseModel):
    order_id: UUID
    amount: Decimal
    paid_at: datetime


def pydantic_model(context: Context) -> Any:
    record(context, "start")
    return Receipt(order_id=ORDER_ID, amount=Decimal("12.30"), paid_at=PAID_AT)


async def python_values(context: Context) -> Any:
    record(context, "start")
    return {
        "amount": Decimal("12.30"),
        "paid_at": PAID_AT,
        "day": date(2026, 11, 27),
        "order_id": ORDER_ID,
        "colour": Colour.RED,
        "point": Point(1, 2),
        "tags": {"b", "a"},
        "pair": (1, 2),
        "receipt": Receipt(order_id=ORDER_ID, amount=Decimal("1"), paid_at=PAID_AT),
    }


def unencodable(context: Context) -> Any:
    record(context, "start")
    return {"when": object()}


def oversized(context: Context) -> Any:
    """A result larger than DynamoDB's 400 KB item."""
    record(context, "start")
    return {"blob": "x" * 500_000}

"""Typed handlers the end-to-end tests run, as ``tests.consumer.typed_handlers:<name>``.

Written with postponed annotations, as a user's module may be: semel resolves
them when the handler loads. Each run is appended to the ledger (see
:mod:`tests.consumer.handlers`), with the type the body arrived as.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from semel.consumer import Context
from tests.consumer.handlers import record

if TYPE_CHECKING:  # as a linter moves an import only annotations use
    from semel.consumer import Context as LaterContext


class OrderPaid(BaseModel):
    order_id: str
    amount: int = Field(gt=0)


class Receipt(BaseModel):
    order_id: str
    charged: int


@dataclass(frozen=True)
class Parcel:
    order_id: str
    grams: int


def _seen(ctx: Context, body: object) -> None:
    record(ctx, f"start {type(body).__name__} {threading.current_thread().name}")


async def charge(order: OrderPaid, ctx: Context) -> Receipt:
    """An async handler with a pydantic body; its model result is stored as JSON."""
    _seen(ctx, order)
    return Receipt(order_id=order.order_id, charged=order.amount)


def ship(order: OrderPaid, ctx: Context) -> dict[str, object]:
    """A plain (thread-run) handler with a pydantic body."""
    _seen(ctx, order)
    return {"shipped": order.order_id}


async def pack(ctx: Context, parcel: Parcel) -> Parcel:
    """The context first, a dataclass body; the dataclass it returns is stored as JSON."""
    _seen(ctx, parcel)
    return Parcel(parcel.order_id, parcel.grams + 10)


async def plain_later(ctx: LaterContext) -> str:
    """A plain handler whose Context is imported only for type checkers."""
    return ctx.key

"""The dead letters ``bench.dlq`` seeds: an incident's, as semel's worker writes them.

Six groups over six hours (connection refused and timeouts after five
attempts, a handler's KeyError, bad bodies, poison keys, a routing key no
handler takes), and a burst of card declines in a tenth of that span: the
group the paced replay takes, 3 % of the letters (3,000 of 100,000). Each
letter has a ~300-byte JSON order event, the producer's headers, semel's DLQ
headers (:func:`semel.consumer.broker.copies.dead_letter_copy`) and its own
letter id; the queue's order is the order they were dead-lettered in.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import orjson
from aio_pika.abc import AbstractConnection
from aiormq.abc import ConfirmationFrameType
from aiormq.channel import Channel as RawChannel
from pamqp.commands import Basic

from bench.broker import PUBLISH_WINDOW, BenchError
from semel.consumer import names
from semel.consumer.broker.letter_filters import Fingerprint
from semel.consumer.names import Reason, Topology
from semel.settings import Settings

SPAN = timedelta(hours=6)  # from the first letter dead-lettered to the last
ROUTES = ("orders.created", "orders.paid", "orders.refunded", "invoices.sent")


@dataclass(frozen=True, slots=True)
class Kind:
    """What made a group of letters dead: the worker's headers for it."""

    reason: Reason
    error: str
    error_type: str | None = None
    frame: str | None = None

    @property
    def group_id(self) -> str:
        return Fingerprint(self.reason.value, self.error_type, self.frame).group_id


KINDS = (  # the background, with each kind's share of it
    (Kind(Reason.MAX_ATTEMPTS, "ConnectError: [Errno 111] Connection refused",
          "httpx.ConnectError", "shop.payments:Gateway.charge:41"), 0.40),
    (Kind(Reason.MAX_ATTEMPTS, "ReadTimeout: timed out after 10.0 s",
          "httpx.ReadTimeout", "shop.payments:Gateway.charge:44"), 0.25),
    (Kind(Reason.PERMANENT_ERROR, "KeyError: 'discount_code'",
          "KeyError", "shop.orders:apply_discount:88"), 0.15),
    (Kind(Reason.INVALID_BODY, "1 validation error for OrderEvent: amount must be > 0"), 0.10),
    (Kind(Reason.POISON, "the key's runs crashed their worker 10 times"), 0.05),
    (Kind(Reason.NO_HANDLER, "no handler of the app takes this routing key"), 0.05),
)  # fmt: skip
# The incident the paced replay takes: card declines for a tenth of the span,
# three letters in ten meanwhile (3 % of all: 3,000 of 100,000).
BURST = Kind(Reason.PERMANENT_ERROR, "CardDeclined: do_not_honor",
             "shop.errors.CardDeclined", "shop.payments:charge:12")  # fmt: skip
BURST_SPAN, BURST_DENSITY = (0.45, 0.55), 0.3


def plan(letters: int) -> list[Kind]:
    """Each letter's kind, in queue order (the same every run)."""
    rng = random.Random(20261128)
    kinds, weights = zip(*KINDS, strict=True)
    drawn = rng.choices(kinds, weights, k=letters)
    first, last = (int(letters * edge) for edge in BURST_SPAN)
    return [BURST if first <= i < last and rng.random() < BURST_DENSITY else kind
            for i, kind in enumerate(drawn)]  # fmt: skip


def key_of(index: int) -> str:
    return f"order-{index:08d}"


def letter(index: int, kind: Kind, exchange: str, at: datetime) -> tuple[bytes, Basic.Properties]:
    """One dead letter as a worker writes it (semel.consumer.broker.copies.dead_letter_copy)."""
    key = key_of(index)
    body = orjson.dumps({
        "event": "order.paid", "order_id": key, "amount": {"value": 4200 + index % 997,
        "currency": "EUR"}, "customer": {"id": f"C-{index % 50_000:06d}", "country": "FR",
        "email": f"c{index % 50_000:06d}@example.com"}, "items": [{"sku": "SKU-000042",
        "qty": 2, "price": 1299}, {"sku": "SKU-000777", "qty": 1, "price": 1602}],
        "paid_at": (at - timedelta(seconds=50)).isoformat(timespec="milliseconds"),
    })  # fmt: skip
    headers: dict[str, Any] = {
        "Idempotency-Key": key,
        "traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01",
        names.H_ATTEMPTS: 5 if kind.reason is Reason.MAX_ATTEMPTS else 1,
        names.H_FIRST_SEEN: (at - timedelta(seconds=47)).isoformat(timespec="milliseconds"),
        names.H_ORIGINAL_EXCHANGE: exchange,
        names.H_ORIGINAL_ROUTING_KEY: ROUTES[index % len(ROUTES)],
        names.H_REASON: kind.reason.value,
        names.H_ERROR: f"{kind.error} ({key})",
        names.H_KEY: key,
        names.H_DEAD_LETTERED_AT: at.isoformat(timespec="milliseconds"),
        names.H_LETTER_ID: uuid.uuid4().hex,
    }
    if kind.error_type is not None:
        headers[names.H_ERROR_TYPE] = kind.error_type
        headers[names.H_ERROR_FRAME] = kind.frame
    properties = Basic.Properties(
        content_type="application/json", delivery_mode=2, message_id=uuid.uuid4().hex,
        app_id="shop", headers=headers,
    )  # fmt: skip
    return body, properties


async def seed(connection: AbstractConnection, settings: Settings, kinds: list[Kind]) -> float:
    """Publish the letters to ``Q.dlx``, ``PUBLISH_WINDOW`` unconfirmed at once; seconds taken."""
    channel = await connection.channel(publisher_confirms=True)
    raw = cast(RawChannel, await channel.get_underlay_channel())
    window = asyncio.Semaphore(PUBLISH_WINDOW)
    pending: set[asyncio.Task[ConfirmationFrameType | None]] = set()
    refused: list[object] = []

    def confirmed(confirm: asyncio.Task[ConfirmationFrameType | None]) -> None:
        pending.discard(confirm)
        window.release()
        if confirm.exception() is not None or not isinstance(confirm.result(), Basic.Ack):
            refused.append(confirm.exception() or confirm.result())

    dlx = Topology(settings.queue).dead_letter_exchange
    first = datetime.now(UTC) - SPAN
    started = time.perf_counter()
    for index, kind in enumerate(kinds):
        await window.acquire()
        if refused:
            break
        body, properties = letter(index, kind, settings.exchange, first + SPAN * index / len(kinds))
        publish = raw.basic_publish(body, exchange=dlx, routing_key=names.DLQ_ROUTING_KEY,
                                    properties=properties, wait=False)  # fmt: skip
        pending.add(confirm := asyncio.create_task(publish))
        confirm.add_done_callback(confirmed)
    await asyncio.gather(*pending, return_exceptions=True)
    await channel.close()
    if refused:
        raise BenchError(f"the broker refused a dead letter: {refused[0]!r}")
    return time.perf_counter() - started

"""The service's handlers through semel's own pipeline, with no broker: what semel
would do with each message (milliseconds a message)."""

from __future__ import annotations

from orders.app import app

from semel.consumer.testing import HandlerKit, SyncHandlerKit

PAID = {"order_id": "o-1", "amount": 1250}


async def test_an_order_is_charged_once() -> None:
    async with HandlerKit(app) as kit:
        first = await kit.send(PAID, key="o-1", routing_key="orders.paid")
        again = await kit.send(PAID, key="o-1", routing_key="orders.paid")
    assert first.acked
    assert first.handler == "charge"
    assert first.stored == {"order_id": "o-1", "charged": 1250}
    assert again.duplicate  # answered from the store: charge() did not run again


async def test_a_payment_without_an_amount_is_dead_lettered_unrun() -> None:
    async with HandlerKit(app) as kit:
        bad = await kit.send({"order_id": "o-2"}, key="o-2", routing_key="orders.paid")
    assert bad.dead_lettered
    assert bad.reason == "invalid-body"
    assert "amount" in bad.headers["x-semel-validation-errors"]


def test_shipping_without_an_address_is_refused_for_good() -> None:
    with SyncHandlerKit(app) as kit:
        shipped = kit.send({"address": "1 Quay St"}, key="o-1", routing_key="orders.eu.packed")
        refused = kit.send({}, key="o-3", routing_key="orders.eu.packed")
    assert shipped.acked
    assert shipped.stored == {"shipped_to": "1 Quay St", "region": "eu"}
    assert refused.dead_lettered
    assert refused.reason == "permanent-error"

"""Typed bodies end to end: a handler annotated with a model or a dataclass gets
the validated body, and a body that fails validation is dead-lettered as
``invalid-body`` before its key is claimed, the handler never run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from semel.consumer.names import H_ERROR, H_REASON, H_VALIDATION_ERRORS
from semel.stores.base import Status, Store
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, eventually
from tests.consumer.test_delivery import (
    assert_dead_letter_headers,
    finished,
    settle_all,
    status_is,
)

pytestmark = [pytest.mark.parametrize("backend", ["sqlite", "postgres"]), pytest.mark.timeout(60)]

SECRET = "4111-1111-1111-1111"  # a value the dead letter's error text must never echo


def starts(ledger: Path) -> dict[str, str]:
    """The event of each key's run: ``start <body type> <thread>``."""
    return {e["key"]: e["event"] for e in read_ledger(ledger) if e["event"].startswith("start")}


async def test_a_typed_async_handler_gets_its_model_and_an_invalid_body_is_dead_lettered(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings(handler="tests.consumer.typed_handlers:charge")
    consumer = await start_consumer(settings)
    await broker.publish(settings, {"order_id": "o-1", "amount": 5}, key="good-1")
    await broker.publish(settings, {"order_id": SECRET, "amount": "lots"}, key="bad")
    await broker.publish(settings, {"order_id": "o-2", "amount": 7}, key="good-2")
    await settle_all(broker, settings, dead_letters=1)
    await finished(consumer, broker, settings, dead_letters=1)

    (letter,) = await broker.dead_letters(settings)
    assert_dead_letter_headers(letter, settings)
    assert (letter.headers[H_REASON], letter.key) == ("invalid-body", "bad")
    assert SECRET not in letter.headers[H_ERROR]  # the log line's error: no body values
    assert "OrderPaid" in letter.headers[H_ERROR]
    errors = orjson.loads(letter.headers[H_VALIDATION_ERRORS])
    assert errors == [
        {
            "loc": ["amount"],
            "type": "int_parsing",
            "msg": "Input should be a valid integer, unable to parse string as an integer",
        }
    ]
    assert orjson.loads(letter.body)["order_id"] == SECRET  # the body itself is kept
    assert await store.get("bad") is None  # never claimed
    ran = starts(ledger)
    assert "bad" not in ran
    assert ran["good-1"].startswith("start OrderPaid ")
    for key, order_id, amount in (("good-1", "o-1", 5), ("good-2", "o-2", 7)):
        record = await store.get(key)
        assert record is not None
        assert record.status is Status.COMPLETED
        assert record.result == {"order_id": order_id, "charged": amount}  # the model, as JSON


async def test_a_typed_def_handler_gets_its_model_on_a_thread(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings(handler="tests.consumer.typed_handlers:ship")
    consumer = await start_consumer(settings)
    await broker.publish(settings, {"order_id": "o-3", "amount": 1}, key="thread")
    await broker.publish(settings, {"amount": 0}, key="refused")  # two errors
    await eventually(lambda: status_is(store, "thread", Status.COMPLETED), what="'thread' done")
    await settle_all(broker, settings, dead_letters=1)
    await finished(consumer, broker, settings, dead_letters=1)

    assert starts(ledger) == {"thread": "start OrderPaid semel-handler"}
    record = await store.get("thread")
    assert record is not None
    assert record.result == {"shipped": "o-3"}
    (letter,) = await broker.dead_letters(settings)
    assert letter.reason == "invalid-body"
    errors: list[dict[str, Any]] = orjson.loads(letter.headers[H_VALIDATION_ERRORS])
    assert [(e["loc"], e["type"]) for e in errors] == [
        (["order_id"], "missing"),
        (["amount"], "greater_than"),
    ]
    assert "2 validation errors" in letter.headers[H_ERROR]


async def test_a_dataclass_body_and_a_dataclass_result(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings(handler="tests.consumer.typed_handlers:pack")
    consumer = await start_consumer(settings)
    await broker.publish(settings, {"order_id": "o-4", "grams": 250}, key="parcel")
    await broker.publish(settings, {"order_id": "o-5", "grams": "heavy"}, key="odd")
    await settle_all(broker, settings, dead_letters=1)
    await finished(consumer, broker, settings, dead_letters=1)

    assert starts(ledger) == {"parcel": "start Parcel MainThread"}
    record = await store.get("parcel")
    assert record is not None
    assert record.result == {"order_id": "o-4", "grams": 260}
    (letter,) = await broker.dead_letters(settings)
    assert (letter.reason, letter.key) == ("invalid-body", "odd")


async def test_a_plain_context_handler_is_unchanged(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    """Any JSON object reaches it: nothing is validated for a handler taking a Context."""
    settings = consumer_settings(handler="tests.consumer.handlers:scripted")
    consumer = await start_consumer(settings)
    await broker.publish(settings, {"amount": "lots", "result": {"ok": 1}}, key="plain")
    await eventually(lambda: status_is(store, "plain", Status.COMPLETED), what="'plain' done")
    await settle_all(broker, settings, dead_letters=0)
    await finished(consumer, broker, settings, dead_letters=0)

    record = await store.get("plain")
    assert record is not None
    assert record.result == {"ok": 1}

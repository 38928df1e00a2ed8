"""The worker's side of the dead letters' stream, on the real broker.

A stream drops a table or an array header without a word, and a decimal
header makes the broker close the publishing connection (541, the worker's
one connection): the worker writes the producer's headers whole into
``x-semel-headers`` and only the scalars beside it. Each dead letter gets a
letter id of its own, whatever the message carried.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from semel.consumer.names import H_HEADERS, H_LETTER_ID, H_REASON, H_REPLAYS
from semel.settings import Settings
from semel.stores.base import Status, Store
from tests.consumer.conftest import StartConsumer
from tests.consumer.harness import Broker, InProcessConsumer, eventually
from tests.consumer.test_delivery import finished, runs, settle_all, status_is
from tests.letters import wait_for_dead_letters

pytestmark = pytest.mark.timeout(60)

LETTER_ID = re.compile(r"[0-9a-f]{32}")

# A producer's headers of every AMQP type a stream cannot keep as it is, and
# scalars beside them. A timestamp travels in whole seconds.
RICH: dict[str, Any] = {
    "trace": {"id": "t-1", "spans": [1, 2], "meta": {"amount": Decimal("0.10")}},
    "tags": ["paid", 7, {"nested": True}, [Decimal("1.5")]],
    "amount": Decimal("12.30"),
    "sent_at": datetime(2026, 11, 27, 1, 30, 5, tzinfo=UTC),
    "raw": bytearray(b"\x00\xff"),
    "note": "zürich",
    "count": 3,
    "ratio": 0.5,
    "urgent": True,
}
SCALARS = ("sent_at", "note", "count", "ratio", "urgent")  # kept at the top too
NOT_SCALARS = ("trace", "tags", "amount")  # only inside x-semel-headers


def same(back: Any, sent: Any) -> bool:
    """Equal, and of the same types all the way down (True is not 1, Decimal("1.50")
    is not Decimal("1.5")); a table's key order is the broker's business."""
    if isinstance(sent, dict):
        return (
            isinstance(back, dict)
            and back.keys() == sent.keys()
            and all(same(back[k], v) for k, v in sent.items())
        )
    if isinstance(sent, list):
        return (
            isinstance(back, list)
            and len(back) == len(sent)
            and all(same(b, v) for b, v in zip(back, sent, strict=True))
        )
    if isinstance(sent, bytes | bytearray):
        return isinstance(back, bytes | bytearray) and bytes(back) == bytes(sent)
    return type(back) is type(sent) and back == sent and str(back) == str(sent)


def reconnects(consumer: InProcessConsumer) -> float:
    """How often the worker's connection was made again (0: the broker never closed it)."""
    registry = consumer.container.metrics().registry
    return registry.get_sample_value("semel_broker_reconnects_total") or 0.0


async def test_a_dead_letter_keeps_every_producer_header_and_the_worker_goes_on(
    settings: Settings, broker: Broker, store: Store, ledger: Path, start_consumer: StartConsumer
) -> None:
    consumer = await start_consumer(settings)
    await broker.publish(settings, {"permanent": "declined"}, key="rich", headers=RICH)
    await broker.publish(settings, {"n": 1}, key="after", headers={"amount": Decimal("1")})
    await eventually(lambda: status_is(store, "after", Status.COMPLETED), what="the next message")
    (letter,) = await wait_for_dead_letters(broker.connection, settings.queue, 1)
    await settle_all(broker, settings, dead_letters=1)
    assert reconnects(consumer) == 0  # the same connection all along
    await finished(consumer, broker, settings, dead_letters=1)
    assert [r["key"] for r in runs(ledger, "after")] == ["after"]

    assert LETTER_ID.fullmatch(letter.letter_id)
    assert letter.headers[H_LETTER_ID] == letter.letter_id
    assert (letter.entry.reason, letter.entry.key) == ("permanent-error", "rich")
    sent = RICH | {"Idempotency-Key": "rich"}
    back = letter.producer_headers()
    assert back == sent
    assert same(back, sent), back
    # What a reader sees at a glance: the scalars as themselves, the rest only
    # inside x-semel-headers (a stream would have dropped it, or the connection).
    for name in SCALARS:
        assert letter.headers[name] == RICH[name], name
    assert not set(NOT_SCALARS) & letter.headers.keys()
    assert isinstance(letter.headers[H_HEADERS], str | bytes)
    assert H_HEADERS not in letter.semel_headers()


async def test_each_dead_letter_gets_a_letter_id_of_its_own(
    settings: Settings, broker: Broker, start_consumer: StartConsumer
) -> None:
    consumer = await start_consumer(settings)
    for n in range(3):
        await broker.publish(settings, {"permanent": "no"}, key=f"declined-{n}")
    # Twice the same bad message: the same body, key and message id.
    for _ in range(2):
        await broker.publish(settings, b"{not json", key="bad", message_id="m-bad")
    # A copy that arrives with a letter's id and a replay count, as a copy of a
    # replayed letter may: the count is kept, the id is not.
    stale = "0" * 32
    await broker.publish(
        settings, {"permanent": "again"}, key="replayed",
        headers={H_LETTER_ID: stale, H_REPLAYS: 2},
    )  # fmt: skip
    await settle_all(broker, settings, dead_letters=6)
    await finished(consumer, broker, settings, dead_letters=6)

    letters = await wait_for_dead_letters(broker.connection, settings.queue, 6)
    ids = [letter.letter_id for letter in letters]
    assert len(set(ids)) == 6, ids
    assert all(LETTER_ID.fullmatch(i) for i in ids), ids
    assert stale not in ids
    assert [letter.headers[H_LETTER_ID] for letter in letters] == ids
    assert sorted(letter.entry.key or "" for letter in letters) == [
        "bad", "bad", "declined-0", "declined-1", "declined-2", "replayed"
    ]  # fmt: skip
    (replayed,) = [letter for letter in letters if letter.entry.key == "replayed"]
    assert replayed.entry.replays == 2
    assert H_LETTER_ID not in replayed.producer_headers()


async def test_decimal_headers_never_close_the_workers_connection(
    settings: Settings, broker: Broker, store: Store, start_consumer: StartConsumer
) -> None:
    """Dead letters, retries and completions of messages with decimal headers, one
    after another: the worker keeps its connection and keeps consuming."""
    consumer = await start_consumer(settings)
    decimals = {"price": Decimal("9.99"), "rates": {"vat": Decimal("0.20")}}
    good = [f"good-{n}" for n in range(4)]
    for n, key in enumerate(good):
        await broker.publish(settings, {"permanent": "no"}, key=f"dead-{n}", headers=decimals)
        await broker.publish(settings, {"fail_until": n % 2}, key=key, headers=decimals)
    # A producer's own x-semel-headers is not the worker's: it is rebuilt, not trusted.
    await broker.publish(
        settings, b"{broken", key="broken",
        headers={H_HEADERS: "not json", "price": Decimal("1.00")},
    )  # fmt: skip
    letters = await wait_for_dead_letters(broker.connection, settings.queue, 5, 30)
    for key in good:
        await eventually(partial(status_is, store, key, Status.COMPLETED), what=key)
    assert reconnects(consumer) == 0
    # Still consuming: a message published now is processed.
    await broker.publish(settings, {"n": 2}, key="last", headers=decimals)
    await eventually(lambda: status_is(store, "last", Status.COMPLETED), what="the last message")
    assert await broker.consumers(settings.queue) > 0
    await settle_all(broker, settings, dead_letters=5)
    assert reconnects(consumer) == 0
    await finished(consumer, broker, settings, dead_letters=5)

    for letter in letters:
        assert letter.headers[H_REASON] in ("permanent-error", "malformed-body")
        expected = decimals if letter.entry.key != "broken" else {"price": Decimal("1.00")}
        sent = expected | {"Idempotency-Key": letter.entry.key}
        assert same(letter.producer_headers(), sent), letter.producer_headers()


async def test_a_decimal_under_semels_prefix_never_closes_the_workers_connection(
    settings: Settings, broker: Broker, store: Store, start_consumer: StartConsumer
) -> None:
    """A header named like semel's own but sent by a producer is still the producer's
    value: a decimal or a table there must not reach the stream as it is either."""
    consumer = await start_consumer(settings)
    odd = {"x-semel-custom": Decimal("1.5"), "x-semel-table": {"a": [1]}}
    await broker.publish(settings, {"permanent": "no"}, key="odd", headers=odd)
    await broker.publish(settings, {"n": 1}, key="after")
    (letter,) = await wait_for_dead_letters(broker.connection, settings.queue, 1)
    await eventually(lambda: status_is(store, "after", Status.COMPLETED), what="the next message")
    assert reconnects(consumer) == 0
    await finished(consumer, broker, settings, dead_letters=1)
    assert letter.entry.key == "odd"

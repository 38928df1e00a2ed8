"""Every bad input ends in ``Q.dlq`` with its reason, writes nothing, and stops nothing.

Each bad message is followed by a good one, on the real broker with an
in-process consumer, per store: the good ones must all complete (the consumer
went on), the bad ones must all be dead-lettered with the documented
``x-semel-reason``, and no bad message may leave a record in the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from semel.consumer.delivery.message import fingerprint
from semel.consumer.names import H_KEY, H_REASON, Topology
from semel.settings import Settings
from semel.stores.base import Status, Store
from tests.consumer.conftest import CONSUMER_BACKENDS, ConsumerSettings, StartConsumer
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, eventually

pytestmark = [
    pytest.mark.parametrize("backend", CONSUMER_BACKENDS),
    pytest.mark.timeout(90),
]

MAX_BODY = 1_048_576  # the default SEMEL_MAX_BODY_BYTES
NO_KEY = object()  # publish without an Idempotency-Key header
GOOD = b'{"event": "order.paid", "order_id": 7}'


@dataclass(frozen=True)
class Bad:
    case: str
    body: bytes
    reason: str
    key: object = None  # None: a valid key of its own, "bad-<case>"
    content_type: str | None = "application/json"

    def header(self) -> object:
        return f"bad-{self.case}" if self.key is None else self.key


CASES = [
    Bad("not-json", b'{"event": "order.paid", "order_id": ', "malformed-body"),
    Bad("json-nan", b'{"amount": NaN}', "malformed-body"),
    Bad("invalid-utf8", b'{"note": "\xff\xfe"}', "malformed-body"),
    Bad("empty-body", b"", "malformed-body"),
    Bad("json-number", b"42", "malformed-body"),
    Bad("json-string", b'"order.paid"', "malformed-body"),
    Bad("json-null", b"null", "malformed-body"),
    Bad("json-array", b'[{"order_id": 7}]', "malformed-body"),
    Bad("too-large", b'{"pad": "' + b"x" * 10_000_000 + b'"}', "too-large"),
    Bad("text-plain", GOOD, "malformed-body", content_type="text/plain"),
    Bad("xml", b"<order id='7'/>", "malformed-body", content_type="application/xml"),
    Bad("missing-key", GOOD, "missing-key", key=NO_KEY),
    Bad("empty-key", GOOD, "invalid-key", key=""),
    Bad("long-key", GOOD, "invalid-key", key="k" * 257),
    Bad("control-char-key", GOOD, "invalid-key", key="order\x07-7"),
    Bad("newline-key", GOOD, "invalid-key", key="order\n7"),
    Bad("integer-key", GOOD, "invalid-key", key=7),
    Bad("list-key", GOOD, "invalid-key", key=["order", 7]),
    Bad("byte-array-key", GOOD, "invalid-key", key=bytearray(b"\xff\xfe")),
]


async def publish(broker: Broker, settings: Settings, bad: Bad) -> None:
    key = bad.header()
    headers: dict[str, Any] = {} if key is NO_KEY else {"Idempotency-Key": key}
    await broker.publish(
        settings,
        bad.body,
        headers=headers,
        content_type=bad.content_type,
        message_id=f"case-{bad.case}",
    )


async def status(store: Store, key: str) -> Status | None:
    record = await store.get(key)
    return None if record is None else record.status


async def all_completed(store: Store, keys: list[str]) -> bool:
    return all([await status(store, key) is Status.COMPLETED for key in keys])


async def test_each_bad_input_is_dead_lettered_with_its_reason_and_the_next_runs(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings(max_body_bytes=MAX_BODY)
    consumer = await start_consumer(settings)
    good_keys = []
    for bad in CASES:
        await publish(broker, settings, bad)
        good_keys.append(f"good-after-{bad.case}")
        await broker.publish(settings, GOOD, key=good_keys[-1])
    # A key of exactly 256 characters is still valid.
    good_keys.append("k" * 256)
    await broker.publish(settings, GOOD, key=good_keys[-1])

    dlq = Topology(settings.queue).dead_letter_queue
    await eventually(lambda: all_completed(store, good_keys), 30, "every good message completed")
    await eventually(lambda: _depth_is(broker, dlq, len(CASES)), 30, f"{len(CASES)} dead letters")
    assert await consumer.finish() == 0

    letters = {letter.message_id: letter for letter in await broker.dead_letters(settings)}
    wrong = {
        bad.case: letters[f"case-{bad.case}"].reason if f"case-{bad.case}" in letters else None
        for bad in CASES
        if f"case-{bad.case}" not in letters or letters[f"case-{bad.case}"].reason != bad.reason
    }
    assert wrong == {}, "cases dead-lettered with another reason (or not at all)"
    # A dead letter keeps its body, and names its key where it had a readable one.
    for bad in CASES:
        letter = letters[f"case-{bad.case}"]
        assert letter.body == bad.body
        expected_key = bad.header() if bad.reason in ("malformed-body", "too-large") else ""
        assert letter.headers[H_KEY] == expected_key, bad.case

    # Nothing was written for a bad message, and the handler never saw one.
    for bad in CASES:
        key = bad.header()
        if isinstance(key, str) and key:
            assert await store.get(key) is None, bad.case
    ran = [event["key"] for event in read_ledger(ledger) if event["event"] == "start"]
    assert sorted(ran) == sorted(good_keys)


async def _depth_is(broker: Broker, queue: str, expected: int) -> bool:
    return await broker.depth(queue) == expected


async def test_a_key_reused_with_another_body_is_dead_lettered_and_keeps_the_first(
    settings: Settings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    consumer = await start_consumer(settings)
    await broker.publish(settings, {"order_id": 7, "amount": 100}, key="reused")
    await eventually(lambda: all_completed(store, ["reused"]), what="first body completed")
    await broker.publish(settings, {"order_id": 7, "amount": 101}, key="reused")
    await broker.publish(settings, {"order_id": 8}, key="next")
    await eventually(lambda: all_completed(store, ["next"]), what="next message completed")
    dlq = Topology(settings.queue).dead_letter_queue
    await eventually(lambda: _depth_is(broker, dlq, 1), what="one dead letter")
    assert await consumer.finish() == 0

    (letter,) = await broker.dead_letters(settings)
    assert letter.headers[H_REASON] == "payload-mismatch"
    assert letter.headers[H_KEY] == "reused"
    record = await store.get("reused")
    assert record is not None
    assert record.status is Status.COMPLETED
    assert record.fingerprint == fingerprint({"order_id": 7, "amount": 100})
    assert [e["key"] for e in read_ledger(ledger) if e["event"] == "start"] == ["reused", "next"]


async def test_a_lone_surrogate_escape_is_dead_lettered_as_malformed(
    settings: Settings, broker: Broker, store: Store, start_consumer: StartConsumer
) -> None:
    consumer = await start_consumer(settings)
    await broker.publish(settings, b'{"note": "\\ud800"}', key="surrogate")
    await broker.publish(settings, GOOD, key="after-surrogate")
    await eventually(lambda: all_completed(store, ["after-surrogate"]), what="next completed")
    dlq = Topology(settings.queue).dead_letter_queue
    try:
        await eventually(lambda: _depth_is(broker, dlq, 1), 5, "the surrogate dead-lettered")
    finally:
        await consumer.finish()
    (letter,) = await broker.dead_letters(settings)
    assert letter.headers[H_REASON] == "malformed-body"
    assert await store.get("surrogate") is None

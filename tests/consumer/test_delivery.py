"""Every row of DESIGN.md's "one delivery" table, observed on the real broker, per store.

Each test publishes like a producer, then looks at queue depths, the dead
letters and the store; the handler's own ledger counts how often it ran.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from semel.consumer.delivery.message import fingerprint
from semel.consumer.names import (
    ERROR_HEADER_LIMIT,
    H_ATTEMPTS,
    H_DEAD_LETTERED_AT,
    H_ERROR,
    H_FIRST_SEEN,
    H_KEY,
    H_ORIGINAL_EXCHANGE,
    H_ORIGINAL_ROUTING_KEY,
    H_REASON,
    Topology,
)
from semel.settings import Settings
from semel.stores.base import Status, Store
from tests.consumer.conftest import CONSUMER_BACKENDS, ConsumerSettings, StartConsumer
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import (
    ROUTING_KEY,
    Broker,
    DeadLetter,
    InProcessConsumer,
    eventually,
)
from tests.consumer.sampler import sampling

pytestmark = [
    pytest.mark.parametrize("backend", CONSUMER_BACKENDS),
    pytest.mark.timeout(60),
]

FP = fingerprint({"n": 1})
DLQ_HEADERS = {
    H_REASON,
    H_ERROR,
    H_ATTEMPTS,
    H_KEY,
    H_ORIGINAL_EXCHANGE,
    H_ORIGINAL_ROUTING_KEY,
    H_FIRST_SEEN,
    H_DEAD_LETTERED_AT,
}

# Bad inputs: (case, body, key, content type, expected reason). None as key = no header.
BAD_INPUTS: list[tuple[str, Any, Any, str | None, str]] = [
    ("not-json", b"{not json", "bad-1", "application/json", "malformed-body"),
    ("invalid-utf8", b'{"a": "\xff"}', "bad-2", "application/json", "malformed-body"),
    ("array", [1, 2], "bad-3", "application/json", "malformed-body"),
    ("text", b'{"case": "text"}', "bad-4", "text/plain", "malformed-body"),
    ("too-large", {"case": "too-large", "pad": "x" * 5000}, "bad-5", None, "too-large"),
    ("no-key", {"case": "no-key"}, None, "application/json", "missing-key"),
    ("long-key", {"case": "long-key"}, "k" * 257, "application/json", "invalid-key"),
    ("number-key", {"case": "number-key"}, 7, "application/json", "invalid-key"),
]


def runs(ledger: Path, key: str, event: str = "start") -> list[dict[str, Any]]:
    return [e for e in read_ledger(ledger) if e["key"] == key and e["event"] == event]


async def status(store: Store, key: str) -> Status | None:
    record = await store.get(key)
    return None if record is None else record.status


async def settle_all(broker: Broker, settings: Settings, dead_letters: int | None) -> None:
    """Wait until ``Q.dlq`` holds ``dead_letters`` (``None``: any number) and every
    other queue stays empty.

    A delivery being processed shows in no depth, and a conflict copy is
    invisible for a moment on its way to the conflict queue; so the queues
    must stay so for a conflict delay. A test then stops its consumer (which
    hands back whatever it still holds) and checks again with :func:`finished`.
    """
    steady = settings.conflict_delay + 0.1
    end = time.monotonic() + 30

    async def quiet() -> bool:
        return await only_dead_letters(broker, settings, dead_letters)

    while True:
        await eventually(quiet, end - time.monotonic(), f"only {dead_letters} dead letters")
        await asyncio.sleep(steady)
        if await quiet():
            return


async def only_dead_letters(broker: Broker, settings: Settings, dead_letters: int | None) -> bool:
    dlq = Topology(settings.queue).dead_letter_queue
    depths = await broker.depths(settings)
    expected = depths[dlq] if dead_letters is None else dead_letters
    return depths[dlq] == expected and sum(depths.values()) == expected


async def finished(
    consumer: InProcessConsumer, broker: Broker, settings: Settings, dead_letters: int
) -> None:
    """Stop the consumer cleanly; every delivery was settled if none came back to a queue."""
    assert await consumer.finish() == 0
    assert await only_dead_letters(broker, settings, dead_letters), await broker.depths(settings)


def assert_dead_letter_headers(letter: DeadLetter, settings: Settings) -> None:
    assert letter.headers.keys() >= DLQ_HEADERS
    assert "x-death" not in letter.headers
    assert letter.headers[H_ORIGINAL_EXCHANGE] == settings.exchange
    assert letter.headers[H_ORIGINAL_ROUTING_KEY] == ROUTING_KEY
    seen = datetime.fromisoformat(letter.headers[H_FIRST_SEEN])
    assert seen <= datetime.fromisoformat(letter.headers[H_DEAD_LETTERED_AT])
    assert len(letter.headers[H_ERROR].encode()) <= ERROR_HEADER_LIMIT


async def test_new_key_runs_once_and_duplicates_are_acked(
    settings: Settings, broker: Broker, store: Store, ledger: Path, start_consumer: StartConsumer
) -> None:
    consumer = await start_consumer(settings)
    await broker.publish(settings, {"n": 1}, key="new")
    await broker.publish(settings, {"n": 1}, key="new")  # an early copy

    async def completed() -> bool:
        return await status(store, "new") is Status.COMPLETED

    await eventually(completed, what="'new' completed")
    await broker.publish(settings, {"n": 1}, key="new")  # a late copy
    await settle_all(broker, settings, dead_letters=0)
    await finished(consumer, broker, settings, dead_letters=0)

    assert len(runs(ledger, "new")) == 1
    record = await store.get("new")
    assert record is not None
    assert record.result == {"key": "new", "fence": record.fence}


async def test_concurrent_copies_run_once_and_wait_in_the_conflict_queue(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings()
    names = Topology(settings.queue)
    consumer = await start_consumer(settings)
    # Longer than the lease: only the heartbeat keeps the copies out.
    sleep = settings.lock_ttl * 1.5
    async with sampling(settings) as sampler:
        for _ in range(5):
            await broker.publish(settings, {"sleep": sleep}, key="hot")
        await eventually(
            lambda: status_is(store, "hot", Status.COMPLETED), sleep + 10, "'hot' completed"
        )
        # Every copy ACKed: a copy held by the conflict queue's returner shows in no depth.
        await consumer.until_settled("duplicate", 4)
        await settle_all(broker, settings, dead_letters=0)
    await finished(consumer, broker, settings, dead_letters=0)

    (run,) = runs(ledger, "hot")
    assert sampler.saw(names.conflict_queue) >= 1
    record = await store.get("hot")
    assert record is not None
    assert (record.fence, record.claims) == (run["fence"], 1)  # claimed once, never taken over


async def status_is(store: Store, key: str, expected: Status) -> bool:
    return await status(store, key) is expected


async def test_dead_workers_claim_is_taken_over_with_a_higher_fence(
    settings: Settings, broker: Broker, store: Store, ledger: Path, start_consumer: StartConsumer
) -> None:
    held = await store.claim("held", FP)  # a worker that died holding its claim
    consumer = await start_consumer(settings)
    async with sampling(settings) as sampler:
        await broker.publish(settings, {"n": 1}, key="held")
        await eventually(lambda: status_is(store, "held", Status.COMPLETED), what="taken over")
        await settle_all(broker, settings, dead_letters=0)
    await finished(consumer, broker, settings, dead_letters=0)

    (takeover,) = runs(ledger, "held")
    # Higher, not always one higher: a takeover claim whose answer missed the call
    # deadline may have landed and been released, and the next claim goes higher
    # still (seen with moto on a loaded machine).
    assert takeover["fence"] > held.fence
    assert takeover["routing_key"] == ROUTING_KEY  # the producer's, after a conflict
    # It waited in the conflict queue while the dead worker's lease ran out.
    assert sampler.saw(Topology(settings.queue).conflict_queue) >= 1


async def test_retries_wait_their_tiers_and_the_last_attempt_dead_letters(
    settings: Settings, broker: Broker, store: Store, ledger: Path, start_consumer: StartConsumer
) -> None:
    names = Topology(settings.queue)
    consumer = await start_consumer(settings)
    async with sampling(settings) as sampler:
        await broker.publish(settings, {"fail_until": 2}, key="flaky")
        await broker.publish(settings, {"fail_until": 99}, key="doomed")
        await eventually(lambda: status_is(store, "flaky", Status.COMPLETED), what="recovered")
        await settle_all(broker, settings, dead_letters=1)
    await finished(consumer, broker, settings, dead_letters=1)

    flaky = runs(ledger, "flaky")
    assert [r["attempt"] for r in flaky] == [1, 2, 3]
    assert {r["routing_key"] for r in flaky} == {ROUTING_KEY}  # the producer's, on retries
    assert flaky[1]["t"] - flaky[0]["t"] >= settings.retry_delays[0]
    assert flaky[2]["t"] - flaky[1]["t"] >= settings.retry_delays[1]
    for delay in settings.retry_delays:
        assert sampler.saw(names.tier_queue(delay)) >= 1

    assert len(runs(ledger, "doomed")) == settings.max_attempts
    assert await status(store, "doomed") is Status.FAILED
    (doomed,) = await broker.dead_letters(settings)
    assert_dead_letter_headers(doomed, settings)
    assert doomed.key == "doomed"
    assert (doomed.reason, doomed.headers[H_ATTEMPTS]) == ("max-attempts", settings.max_attempts)
    assert doomed.headers[H_ERROR] == "RuntimeError: transient failure on attempt 3"
    first_seen = datetime.fromisoformat(doomed.headers[H_FIRST_SEEN])
    dead_at = datetime.fromisoformat(doomed.headers[H_DEAD_LETTERED_AT])
    assert (dead_at - first_seen).total_seconds() >= sum(settings.retry_delays)


async def test_permanent_error_poison_and_copies_of_failed_keys(
    settings: Settings, broker: Broker, store: Store, ledger: Path, start_consumer: StartConsumer
) -> None:
    for _ in range(settings.max_claims):  # a key that never completes
        claim = await store.claim("poisoned", FP)
        await store.release("poisoned", claim.fence)
    consumer = await start_consumer(settings)
    await broker.publish(settings, {"permanent": "card declined"}, key="declined")
    await broker.publish(settings, {"n": 1}, key="poisoned")
    await settle_all(broker, settings, dead_letters=2)
    # A copy of a key whose handler failed is acknowledged: its dead letter was
    # confirmed before the key was marked failed. A copy of a poison key is
    # dead-lettered again: the claim marked it before its dead letter existed.
    await broker.publish(settings, {"permanent": "card declined"}, key="declined")
    await broker.publish(settings, {"n": 1}, key="poisoned")
    await settle_all(broker, settings, dead_letters=3)
    await finished(consumer, broker, settings, dead_letters=3)

    assert len(runs(ledger, "declined")) == 1
    assert runs(ledger, "poisoned") == []
    assert await status(store, "declined") is Status.FAILED
    assert await status(store, "poisoned") is Status.FAILED
    all_letters = await broker.dead_letters(settings)
    assert sorted(letter.key for letter in all_letters) == ["declined", "poisoned", "poisoned"]
    letters = {letter.key: letter for letter in all_letters}
    for letter in all_letters:
        assert_dead_letter_headers(letter, settings)
    assert letters["declined"].reason == "permanent-error"
    assert letters["declined"].headers[H_ERROR] == "PermanentError: card declined"
    assert letters["declined"].headers[H_ATTEMPTS] == 1
    assert letters["poisoned"].reason == "poison"


async def test_bad_inputs_and_key_reuse_are_dead_lettered_without_store_writes(
    settings: Settings, broker: Broker, store: Store, ledger: Path, start_consumer: StartConsumer
) -> None:
    consumer = await start_consumer(settings)
    await broker.publish(settings, {"n": 1}, key="reused")
    await eventually(lambda: status_is(store, "reused", Status.COMPLETED), what="completed")
    original = await store.get("reused")
    await broker.publish(settings, {"n": 2}, key="reused", message_id="m-2")
    for case, body, key, content_type, _ in BAD_INPUTS:
        await broker.publish(settings, body, key=key, content_type=content_type,
                             headers={"case": case})  # fmt: skip
    await settle_all(broker, settings, dead_letters=len(BAD_INPUTS) + 1)
    await broker.publish(settings, {"n": 3}, key="after")  # the consumer goes on
    await eventually(lambda: status_is(store, "after", Status.COMPLETED), what="next message")
    await finished(consumer, broker, settings, dead_letters=len(BAD_INPUTS) + 1)

    letters = {letter.headers.get("case") or letter.key: letter
               for letter in await broker.dead_letters(settings)}  # fmt: skip
    for letter in letters.values():
        assert_dead_letter_headers(letter, settings)
    for case, _, key, _, reason in BAD_INPUTS:
        assert letters[case].reason == reason, case
        if isinstance(key, str) and len(key) <= 256:
            assert letters[case].key == key
            assert await store.get(key) is None  # nothing written for a bad input
    assert letters["no-key"].key == ""
    assert {e["key"] for e in read_ledger(ledger)} == {"reused", "after"}

    mismatch = letters["reused"]
    assert mismatch.reason == "payload-mismatch"
    assert (mismatch.body, mismatch.message_id) == (b'{"n":2}', "m-2")
    assert mismatch.content_type == "application/json"
    record = await store.get("reused")
    assert record is not None
    assert original is not None
    # The completed record is untouched (its expiry is derived on each read).
    assert (record.status, record.fence, record.fingerprint, record.result) == (
        original.status, original.fence, original.fingerprint, original.result
    )  # fmt: skip

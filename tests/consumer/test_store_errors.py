"""A store that answers with an error instead of a decision, under a running consumer.

Each backend sorts its server's errors into unavailable, misconfigured or a
refused key (tests/faults/test_*_errors.py prove that per server); these tests
prove what the consumer then does with each, on a real server, and what it
does when semel itself raises after a claim.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from semel.consumer.names import ERROR_HEADER_LIMIT, H_REASON, Reason, Topology
from semel.settings import Settings
from semel.stores.base import JSON, Claim, ClaimRequest, Completion, DelegatingStore, Status, Store
from semel.stores.errors import KeyRefused, StoreUnavailable
from tests.conftest import open_store
from tests.consumer.conftest import CONSUMER_BACKENDS, ConsumerSettings, StartConsumer
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, eventually
from tests.consumer.test_delivery import finished, runs, settle_all, status_is

pytestmark = pytest.mark.timeout(60)


class BuggyCompletion(DelegatingStore):
    """Raises a non-store error on the first completion: a bug after the claim.

    Batched or not: the consumer sends completions through ``complete_many``
    when the store has it.
    """

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.raised = False

    def _bug(self) -> None:
        if not self.raised:
            self.raised = True
            raise RuntimeError("a bug between the handler and the completion")

    async def complete(self, key: str, fence: int, result: JSON) -> bool:
        self._bug()
        return await self.inner.complete(key, fence, result)

    async def complete_many(self, completions: Sequence[Completion]) -> Sequence[bool | KeyRefused]:
        self._bug()
        return await self.inner.complete_many(completions)


async def test_a_bug_in_the_completion_is_retried_and_never_runs_the_handler_again(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings(retention=600)
    buggy = BuggyCompletion(await open_store(settings))
    try:
        consumer = await start_consumer(settings, buggy)
        await broker.publish(settings, {"n": 1}, key="k")
        await eventually(lambda: _raised(buggy), what="the bug")
        # The key is held, not released, and the completion retried: the
        # handler succeeded, and running it again is what must never happen.
        await eventually(lambda: status_is(store, "k", Status.COMPLETED), 10, "'k' completed")
        await settle_all(broker, settings, dead_letters=0)
        await finished(consumer, broker, settings, dead_letters=0)
        assert len(runs(ledger, "k")) == 1
    finally:
        await buggy.close()


async def _raised(buggy: BuggyCompletion) -> bool:
    return buggy.raised


@pytest.mark.parametrize("backend", ["redis"])
async def test_a_key_the_store_cannot_hold_is_dead_lettered_alone(
    settings: Settings, broker: Broker, store: Store, ledger: Path, start_consumer: StartConsumer
) -> None:
    foreign = f"{settings.key_prefix}:taken"
    client = aioredis.Redis.from_url(settings.redis_url)
    try:
        await client.set(foreign, "a value some other program keeps here")
        await start_consumer(settings)
        for key in ("before", "taken", "after"):
            await broker.publish(settings, {"n": 1}, key=key)
        for key in ("before", "after"):
            await eventually(partial(status_is, store, key, Status.COMPLETED), what=key)
        dlq = Topology(settings.queue).dead_letter_queue
        await eventually(lambda: _depth_is(broker, dlq, 1), what="one dead letter")
        (letter,) = await broker.dead_letters(settings)
        assert letter.headers[H_REASON] == Reason.STORE_REFUSED.value
        assert await client.get(foreign) == b"a value some other program keeps here"
        assert runs(ledger, "taken") == []
        assert await broker.depth(settings.queue) == 0
    finally:
        await client.delete(foreign)
        await client.aclose()


async def _depth_is(broker: Broker, queue: str, depth: int) -> bool:
    return await broker.depth(queue) == depth


async def test_a_store_not_set_up_for_semel_stops_consumption_and_loses_nothing(
    settings: Settings, broker: Broker, store: Store, ledger: Path, start_consumer: StartConsumer
) -> None:
    await start_consumer(settings)
    await broker.publish(settings, {"n": 0}, key="before")
    await eventually(lambda: status_is(store, "before", Status.COMPLETED), what="'before' done")
    # Somebody drops semel's table under the running worker.
    with sqlite3.connect(settings.sqlite_path) as conn:
        conn.execute(f"DROP TABLE {settings.postgres_table}")
    for n in range(3):
        await broker.publish(settings, {"n": n}, key=f"after-{n}")

    async def stopped_with_everything_queued() -> bool:
        return (
            await broker.consumers(settings.queue) == 0 and await broker.depth(settings.queue) == 3
        )

    await eventually(stopped_with_everything_queued, 20, "consumption stopped, 3 queued")
    assert await broker.depth(Topology(settings.queue).dead_letter_queue) == 0
    assert [e for e in read_ledger(ledger) if e["key"].startswith("after")] == []


class WritesFail(DelegatingStore):
    """A store whose ping answers while every claim fails: a full disk, say."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.claims = 0

    def _refuse(self) -> None:
        self.claims += 1
        raise StoreUnavailable(self.backend, "writes refused while the ping answers")

    async def claim(self, key: str, fingerprint: str) -> Claim:
        self._refuse()
        raise AssertionError("unreachable")

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> Sequence[Claim | KeyRefused]:
        self._refuse()
        raise AssertionError("unreachable")


async def test_a_store_whose_ping_passes_while_writes_fail_is_retried_ever_more_slowly(
    settings: Settings, broker: Broker, start_consumer: StartConsumer
) -> None:
    failing = WritesFail(await open_store(settings))
    try:
        await start_consumer(settings, failing)
        await broker.publish(settings, {"n": 1}, key="k")
        await eventually(lambda: _claimed(failing), what="the first claim")
        started, first = asyncio.get_running_loop().time(), failing.claims
        await asyncio.sleep(4.0)  # the window the pauses are counted over
        tries = failing.claims - first
        # Pauses of 0.2, 0.4, 0.8, 1.6 s fit 4 tries in 4 s; a back-off that
        # restarts every round tries about every 0.2 s.
        assert tries <= 6, f"{tries} claims in {asyncio.get_running_loop().time() - started:.1f}s"
        assert await broker.depth(Topology(settings.queue).dead_letter_queue) == 0
    finally:
        await failing.close()


async def _claimed(failing: WritesFail) -> bool:
    return failing.claims > 0


@pytest.mark.parametrize("backend", CONSUMER_BACKENDS)
async def test_an_error_no_store_takes_as_it_is_is_stored_safely_after_one_run(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings(handler="tests.consumer.handlers:unstorable_error")
    await start_consumer(settings)
    await broker.publish(settings, {"n": 1}, key="k")
    await eventually(partial(status_is, store, "k", Status.FAILED), 20, "'k' marked failed")
    dlq = Topology(settings.queue).dead_letter_queue
    await eventually(partial(_depth_is, broker, dlq, 1), what="one dead letter")
    (letter,) = await broker.dead_letters(settings)
    assert letter.headers[H_REASON] == Reason.PERMANENT_ERROR.value
    record = await store.get("k")
    assert record is not None
    assert record.error is not None
    assert record.error.startswith("PermanentError: nul \\x00 surrogate \\ud800 xxx")
    assert len(record.error.encode("utf-8")) <= ERROR_HEADER_LIMIT
    assert len(runs(ledger, "k")) == 1
    assert await broker.depth(settings.queue) == 0


class Stalling(DelegatingStore):
    """Heartbeats that never get an answer, or claims answered late, until told otherwise."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.stall_heartbeats = False
        self.claim_delay = 0.0

    async def heartbeat(self, key: str, fence: int) -> bool:
        if self.stall_heartbeats:
            await asyncio.Event().wait()  # sent, never answered: no reset, no reply
        return await self.inner.heartbeat(key, fence)

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> Sequence[Claim | KeyRefused]:
        answers = await self.inner.claim_many(requests)
        await asyncio.sleep(self.claim_delay)  # the answer is on its way, slowly
        return answers


async def test_a_heartbeat_never_answered_ends_the_handler_by_the_end_of_its_lease(
    settings: Settings, broker: Broker, store: Store, ledger: Path, start_consumer: StartConsumer
) -> None:
    stalling = Stalling(await open_store(settings))
    stalling.stall_heartbeats = True
    try:
        await start_consumer(settings, stalling)
        await broker.publish(settings, {"sleep": 5}, key="k")  # far longer than the lease
        await eventually(lambda: _started(ledger, "k"), what="'k' running")
        started = runs(ledger, "k")[0]["t"]
        # Cancelled by the end of its 1.5 s lease: the run never reaches its end.
        await eventually(partial(_depth_is, broker, settings.queue, 1), 10, "handed back")
        assert [e for e in read_ledger(ledger) if e["event"] == "end"] == []
        assert time.time() - started < settings.handler_timeout
        stalling.stall_heartbeats = False
        await eventually(partial(status_is, store, "k", Status.COMPLETED), 30, "'k' completed")
    finally:
        await stalling.close()


async def _started(ledger: Path, key: str) -> bool:
    return bool(runs(ledger, key))


async def test_a_claim_answered_too_late_for_its_lease_does_not_start_the_handler(
    settings: Settings, broker: Broker, store: Store, ledger: Path, start_consumer: StartConsumer
) -> None:
    stalling = Stalling(await open_store(settings))
    stalling.claim_delay = settings.lock_ttl * 0.6  # past the first heartbeat's due time
    try:
        await start_consumer(settings, stalling)
        await broker.publish(settings, {"n": 1}, key="k")

        async def claimed_and_released() -> bool:
            record = await store.get("k")
            return (
                record is not None
                and record.claims >= 1
                and await broker.depth(settings.queue) == 1
            )

        await eventually(claimed_and_released, 10, "claimed, released and handed back")
        assert runs(ledger, "k") == []
        stalling.claim_delay = 0.0
        await eventually(partial(status_is, store, "k", Status.COMPLETED), 30, "'k' completed")
        assert len(runs(ledger, "k")) == 1
    finally:
        await stalling.close()

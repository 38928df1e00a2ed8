"""The FastStream middleware on the real broker and stores: each delivery of a
FastStream subscriber gets the worker's outcomes (see docs/faststream.md)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from faststream import AckPolicy
from faststream import Context as FromContext
from faststream.rabbit import ExchangeType, RabbitBroker, RabbitExchange, RabbitQueue

from semel.consumer import Context, PermanentError
from semel.consumer.embedded import Semel, current
from semel.consumer.names import H_ATTEMPTS, H_ERROR, H_KEY, H_REASON, Topology
from semel.settings import Settings
from tests.consumer.harness import ROUTING_KEY, Broker, eventually

pytestmark = pytest.mark.timeout(90)
SEMEL_CONTEXT = FromContext("semel")  # what a subscriber names to receive semel's context
each_store = pytest.mark.parametrize("backend", ["sqlite", "redis", "postgres"], indirect=True)


@dataclass
class Runs:
    """What the subscriber saw: one entry per run, and a gate slow runs wait on."""

    seen: list[dict[str, Any]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    running: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    def keys(self) -> list[str]:
        return [run["key"] for run in self.seen]


@dataclass
class Service:
    broker: RabbitBroker
    runs: Runs


@contextlib.asynccontextmanager
async def faststream_app(
    semel: Semel, settings: Settings, runs: Runs, *, declare_first: bool = True
) -> AsyncIterator[RabbitBroker]:
    """A FastStream app with the middleware, consuming the test's queue."""
    fs = RabbitBroker(settings.amqp_url, middlewares=[semel.faststream()])
    exchange = RabbitExchange(settings.exchange, type=ExchangeType.TOPIC, durable=True)
    queue = RabbitQueue(settings.queue, durable=True, routing_key=ROUTING_KEY)

    @fs.subscriber(queue, exchange)
    async def handle(body: dict[str, Any], ctx: Context = SEMEL_CONTEXT) -> Any:
        assert current() == ctx  # the same, from semel's own accessor
        runs.seen.append({"key": ctx.key, "fence": ctx.fence, "attempt": ctx.attempt, **body})
        runs.running.set()
        if body.get("hold"):
            try:
                await runs.release.wait()
            except asyncio.CancelledError:
                runs.cancelled.set()
                raise
        if body.get("pause"):
            await asyncio.sleep(body["pause"])
        if body.get("permanent"):
            raise PermanentError("refused for good")
        if ctx.attempt <= body.get("fail", 0):
            raise RuntimeError(f"attempt {ctx.attempt} failed")
        return {"charged": body.get("n")}

    async with fs:
        await fs.start()
        if declare_first:  # else at the first delivery; most tests look at the DLQ first
            await semel.door(settings.queue)
        yield fs


@pytest.fixture
async def service(semel: Semel, settings: Settings) -> AsyncIterator[Service]:
    runs = Runs()
    async with faststream_app(semel, settings, runs) as fs:
        yield Service(fs, runs)


async def settled(broker: Broker, settings: Settings) -> None:
    """Wait until the queue and its conflict queue hold nothing."""
    names = Topology(settings.queue)

    async def empty() -> bool:
        return all(
            [await broker.depth(settings.queue) == 0, await broker.depth(names.conflict_queue) == 0]
        )

    await eventually(empty, 20, "queues drained")


@each_store
async def test_each_key_runs_once_and_duplicates_are_acked_without_running(
    service: Service, broker: Broker, settings: Settings
) -> None:
    for n, key in [(1, "a"), (2, "b"), (1, "a"), (1, "a"), (3, "c")]:
        await broker.publish(settings, {"n": n}, key=key)

    async def all_ran() -> bool:
        return sorted(service.runs.keys()) == ["a", "b", "c"]

    await eventually(all_ran, 20, "a, b and c ran")
    await settled(broker, settings)
    assert sorted(service.runs.keys()) == ["a", "b", "c"]  # the two copies of a never ran
    assert await broker.dead_letters(settings) == []
    run = service.runs.seen[0]
    assert run["attempt"] == 1
    assert run["fence"] > 0


@each_store
# FastStream 0.7.3's request() leaves its anyio memory streams unclosed.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_duplicate_request_gets_the_stored_reply(
    service: Service, settings: Settings
) -> None:
    first = await service.broker.request(
        {"n": 7}, queue=settings.queue, headers={"Idempotency-Key": "rpc-1"}, timeout=10
    )
    again = await service.broker.request(
        {"n": 7}, queue=settings.queue, headers={"Idempotency-Key": "rpc-1"}, timeout=10
    )
    assert await first.decode() == await again.decode() == {"charged": 7}
    assert service.runs.keys() == ["rpc-1"]


@each_store
async def test_failures_retry_on_the_tiers_then_dead_letter_with_reasons(
    service: Service, broker: Broker, settings: Settings
) -> None:
    await broker.publish(settings, {"n": 1, "fail": 1}, key="once")  # fails once, then runs
    await broker.publish(settings, {"n": 2, "fail": 99}, key="never")  # max_attempts=3
    await broker.publish(settings, {"n": 3, "permanent": True}, key="refused")

    async def letters_out() -> bool:
        return await broker.depth(Topology(settings.queue).dead_letter_queue) == 2

    await eventually(letters_out, 30, "two dead letters")
    expected = {("once", 1), ("once", 2), ("never", 1), ("never", 2), ("never", 3), ("refused", 1)}

    # Waited for, not assumed done with the dead letters: on a slow machine a
    # retry's claim can outlast the store's deadline, and its copy then waits
    # in the conflict queue (held by semel's returner, where no queue depth
    # shows it) until the lease of that claim runs out.
    def attempts() -> set[tuple[str, int]]:
        return {(run["key"], run["attempt"]) for run in service.runs.seen}

    async def all_ran() -> bool:
        return attempts() >= expected

    await eventually(all_ran, 20, "every attempt ran")
    await settled(broker, settings)
    assert attempts() == expected
    letters = {
        letter.headers[H_KEY]: letter.headers for letter in await broker.dead_letters(settings)
    }
    assert letters["never"][H_REASON] == "max-attempts"
    assert letters["never"][H_ATTEMPTS] == 3
    assert "attempt 3 failed" in letters["never"][H_ERROR]
    assert letters["refused"][H_REASON] == "permanent-error"


@each_store
async def test_bad_input_is_dead_lettered_before_the_subscriber_runs(
    service: Service, broker: Broker, settings: Settings
) -> None:
    await broker.publish(settings, b"{not json", key="bad")
    await broker.publish(settings, {"n": 1})  # no key
    await broker.publish(settings, {"n": 1}, key="same")
    await broker.publish(settings, {"n": 2}, key="same")  # same key, another body

    async def letters_out() -> bool:
        return await broker.depth(Topology(settings.queue).dead_letter_queue) == 3

    await eventually(letters_out, 20, "three dead letters")
    reasons = sorted(letter.headers[H_REASON] for letter in await broker.dead_letters(settings))
    assert reasons == ["malformed-body", "missing-key", "payload-mismatch"]
    assert service.runs.keys() == ["same"]


def settled_as(semel: Semel, outcome: str) -> float:
    """Deliveries ``semel`` settled with ``outcome`` (a metric's value)."""
    value = semel.metrics.registry.get_sample_value(
        "semel_messages_total", {"outcome": outcome, "reason": ""}
    )
    return value or 0


async def counted(semel: Semel, outcome: str, at_least: int) -> bool:
    return settled_as(semel, outcome) >= at_least


@each_store
async def test_an_in_progress_copy_is_parked_not_requeued_hot_nor_acked(
    service: Service, broker: Broker, settings: Settings, semel: Semel
) -> None:
    await broker.publish(settings, {"n": 1, "hold": True}, key="slow")
    await asyncio.wait_for(service.runs.running.wait(), 10)
    await broker.publish(settings, {"n": 1, "hold": True}, key="slow")  # while the first runs

    async def parked() -> bool:  # the copy waits out the conflict delay, held by the returner
        return await broker.depth(settings.queue) == 0

    await eventually(parked, 10, "the copy taken off the queue")
    assert service.runs.keys() == ["slow"]
    service.runs.release.set()
    # The parked copy comes back after the first completed: a duplicate, never run.
    await eventually(lambda: counted(semel, "duplicate", 1), 10, "the copy ACKed as a duplicate")
    await settled(broker, settings)
    assert service.runs.keys() == ["slow"]
    assert await broker.dead_letters(settings) == []


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
async def test_a_lost_lease_cancels_the_subscriber_and_parks_the_delivery(
    service: Service, broker: Broker, settings: Settings, semel: Semel
) -> None:
    await broker.publish(settings, {"n": 1, "hold": True}, key="held")
    await asyncio.wait_for(service.runs.running.wait(), 10)
    await take_over(settings, "held")
    # The next renewal (a third of the lease later) hears of it.
    await asyncio.wait_for(service.runs.cancelled.wait(), settings.lock_ttl)
    await eventually(lambda: counted(semel, "conflict", 1), 10, "parked as a conflict")
    assert await broker.dead_letters(settings) == []


async def take_over(settings: Settings, key: str) -> None:
    """What another worker's takeover leaves in the row: a higher fence, a fresh lease."""
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(
        settings.postgres_dsn, autocommit=True
    ) as conn:
        await conn.execute(
            sql.SQL(
                "UPDATE {} SET fence = fence + 1, lock_expires_at = now() + interval '60 s' "
                "WHERE key = %s"
            ).format(sql.Identifier(settings.postgres_table)),
            (f"{settings.key_prefix}:{key}",),
        )


@each_store
async def test_concurrent_copies_on_two_apps_run_each_key_once(
    service: Service, broker: Broker, settings: Settings, semel: Semel
) -> None:
    """Two apps (two processes, as far as the store can tell) on one queue, every key
    published three times at once: each key runs once, the copies are ACKed as
    duplicates or parked until the first run completes."""
    keys = [f"k{i}" for i in range(40)]
    async with Semel(settings) as other, faststream_app(other, settings, service.runs):
        for key in keys:
            for _ in range(3):
                await broker.publish(settings, {"n": 1, "pause": 0.05}, key=key)

        async def all_settled() -> bool:
            settled = [settled_as(s, o) for s in (semel, other) for o in ("processed", "duplicate")]
            return sum(settled) == len(keys) * 3

        await eventually(all_settled, 30, "every copy completed or ACKed as a duplicate")
    assert sorted(service.runs.keys()) == sorted(keys)  # each key ran exactly once


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_subscriber_that_acks_first_is_refused_with_its_reason(
    semel: Semel, settings: Settings, broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    """AckPolicy.ACK_FIRST consumes with no_ack: semel refuses to pretend."""
    fs = RabbitBroker(settings.amqp_url, middlewares=[semel.faststream()])
    ran = asyncio.Event()

    @fs.subscriber(RabbitQueue(settings.queue, durable=True), ack_policy=AckPolicy.ACK_FIRST)
    async def handle(body: dict[str, Any]) -> None:
        ran.set()

    async with fs:
        await fs.start()
        await fs.publish({"n": 1}, queue=settings.queue, headers={"Idempotency-Key": "k"})

        printed: list[str] = []

        async def refused() -> bool:  # FastStream's own logger prints it
            printed.append(capsys.readouterr().out)
            return "use the default ack policy" in "".join(printed)

        await eventually(refused, 10, "the delivery refused, saying why")
    assert not ran.is_set()


@pytest.mark.parametrize("backend", ["redis"], indirect=True)
async def test_the_queues_beside_the_subscribers_are_declared_at_its_first_delivery(
    semel: Semel, settings: Settings, broker: Broker
) -> None:
    runs = Runs()
    async with faststream_app(semel, settings, runs, declare_first=False):
        await broker.publish(settings, {"n": 1, "fail": 1}, key="late")  # retried once

        async def retried() -> bool:
            return [run["attempt"] for run in runs.seen] == [1, 2]

        await eventually(retried, 20, "attempt 2 back from the retry tier")
    names = Topology(settings.queue)
    for queue in (names.conflict_queue, names.dead_letter_queue, names.tier_queue(0.2)):
        assert await broker.depth(queue) == 0  # declared (a passive declare would fail)

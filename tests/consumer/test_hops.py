"""Every hop is a confirmed publish made by semel, never the broker's dead-lettering.

Parking an in-progress conflict publishes a copy to ``Q.retry.conflict`` and
ACKs the original after the confirm; the workers consume the delay queues and
publish each message back to Q when it is due. On quorum and classic queues.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import aio_pika
import pytest
from aio_pika.abc import FieldValue

from semel.consumer.broker.delays import due_in
from semel.consumer.broker.settle import Settler
from semel.consumer.delivery.decide import NackToConflict, Outcome
from semel.consumer.names import DELIVERY_LIMIT, H_PARKED_AT, Topology
from semel.settings import Settings
from semel.stores.base import Status, Store
from tests.conftest import Rabbitmqctl
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.handlers import LEDGER_ENV
from tests.consumer.harness import Broker, ConsumerProcess, eventually, processes
from tests.consumer.test_delivery import finished, runs, status_is
from tests.consumer.test_delivery_limit import queue_arguments

pytestmark = pytest.mark.timeout(90)

QUEUE_TYPES = ["quorum", "classic"]
DEAD_LETTERING = ("x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key")


def delay_queue_names(settings: Settings) -> list[str]:
    names = Topology(settings.queue)
    return [names.conflict_queue, *(names.tier_queue(d) for d in settings.retry_delays)]


async def park_directly(
    broker: Broker, queue: str, key: str, parked_at_ms: int | None = None
) -> None:
    """Put a message in a delay queue the way a worker parks one."""
    headers: dict[str, FieldValue] = {"Idempotency-Key": key}
    if parked_at_ms is not None:
        headers[H_PARKED_AT] = parked_at_ms
    message = aio_pika.Message(
        b'{"n": 1}',
        headers=headers,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )
    await broker.channel.default_exchange.publish(message, routing_key=queue)


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_delay_queues_have_no_ttl_and_no_dead_letter_exchange(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    rabbitmqctl: Rabbitmqctl,
    queue_type: str,
) -> None:
    settings = consumer_settings(queue_type=queue_type)
    await broker.declare(settings)
    for queue in delay_queue_names(settings):
        arguments = await queue_arguments(rabbitmqctl, queue)
        assert not set(DEAD_LETTERING) & arguments.keys(), (queue, arguments)


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_an_in_progress_conflict_is_parked_as_a_confirmed_copy(
    consumer_settings: ConsumerSettings, broker: Broker, queue_type: str
) -> None:
    settings = consumer_settings(queue_type=queue_type)
    names = Topology(settings.queue)
    await broker.declare(settings)
    await broker.publish(settings, {"n": 1}, key="busy")
    work = await broker.channel.declare_queue(settings.queue, passive=True)
    delivery = await work.get(no_ack=False, timeout=5)
    settler = await Settler.open(broker.channel, names)

    before = int(time.time() * 1000)
    applied = await settler.finish(delivery, NackToConflict())

    assert (applied.frame, applied.sent) == ("ack", True)
    conflict = await broker.channel.declare_queue(names.conflict_queue, passive=True)
    parked = await conflict.get(no_ack=True, timeout=5)
    assert "x-death" not in parked.headers  # published by semel, not dead-lettered
    assert parked.headers["Idempotency-Key"] == "busy"
    stamp = parked.headers[H_PARKED_AT]
    assert isinstance(stamp, int)
    assert before <= stamp <= int(time.time() * 1000)
    assert parked.body == delivery.body
    assert await broker.depth(settings.queue) == 0


async def test_a_conflict_that_cannot_be_parked_is_handed_back_under_its_own_outcome(
    consumer_settings: ConsumerSettings, broker: Broker
) -> None:
    # The copy is unroutable (the conflict queue's binding is gone): the
    # delivery goes back to Q, and the log and metrics still say why the
    # handler did not complete, as they did when the broker dead-lettered it.
    settings = consumer_settings()
    names = Topology(settings.queue)
    await broker.declare(settings)
    conflict = await broker.channel.declare_queue(names.conflict_queue, passive=True)
    await conflict.unbind(names.retry_exchange, names.conflict_routing_key)
    await broker.publish(settings, {"n": 1}, key="taken")
    work = await broker.channel.declare_queue(settings.queue, passive=True)
    delivery = await work.get(no_ack=False, timeout=5)
    publisher = await broker.connection.channel(publisher_confirms=True, on_return_raises=True)
    settler = await Settler.open(publisher, names)

    applied = await settler.finish(delivery, NackToConflict(Outcome.FENCED_OUT))

    assert (applied.outcome, applied.frame, applied.sent) == (Outcome.FENCED_OUT, "nack", True)
    assert applied.logged == "fenced-out"
    await publisher.close()

    async def back_in_q() -> bool:
        return await broker.depth(settings.queue) == 1

    await eventually(back_in_q, 5, "the delivery back in Q")


def test_when_a_parked_message_is_due_is_bounded_by_the_queue_delay() -> None:
    now = 1_000_000.0
    parked_ms = int(now * 1000)
    assert due_in({H_PARKED_AT: parked_ms}, 5.0, now) == 5.0
    assert due_in({H_PARKED_AT: parked_ms - 2000}, 5.0, now) == 3.0
    assert due_in({H_PARKED_AT: parked_ms - 60_000}, 5.0, now) == 0.0  # overdue: at once
    # Stamped by a clock an hour ahead: held one delay, not an hour.
    assert due_in({H_PARKED_AT: parked_ms + 3_600_000}, 5.0, now) == 5.0
    # Parked by an earlier semel (no stamp), or a stamp of another type: one delay.
    assert due_in({}, 5.0, now) == 5.0
    assert due_in({H_PARKED_AT: b"12"}, 5.0, now) == 5.0


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_the_workers_bring_delayed_messages_back_when_due(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
    queue_type: str,
) -> None:
    settings = consumer_settings(queue_type=queue_type, conflict_delay=1.0)
    names = Topology(settings.queue)
    await broker.declare(settings)
    now_ms = int(time.time() * 1000)
    await park_directly(broker, names.conflict_queue, "fresh", now_ms)
    await park_directly(broker, names.tier_queue(settings.retry_delays[0]), "tier", now_ms)
    await park_directly(broker, names.conflict_queue, "unstamped")
    started = time.monotonic()
    consumer = await start_consumer(settings)

    async def all_done() -> bool:
        keys = ("fresh", "tier", "unstamped")
        return all([await status_is(store, key, Status.COMPLETED) for key in keys])

    await eventually(all_done, 20, "every delayed key completed")
    # The unstamped one waited one conflict delay after the worker took it.
    assert time.monotonic() - started >= settings.conflict_delay
    await finished(consumer, broker, settings, dead_letters=0)
    for key in ("fresh", "tier", "unstamped"):
        assert len(runs(ledger, key)) == 1, key


def worker(settings: Settings, log: Path, ledger: Path) -> ConsumerProcess:
    return ConsumerProcess(settings, log, **{LEDGER_ENV: str(ledger)}).start()


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_a_worker_killed_holding_delayed_messages_loses_none(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    tmp_path: Path,
    queue_type: str,
) -> None:
    settings = consumer_settings(queue_type=queue_type, conflict_delay=30.0)
    names = Topology(settings.queue)
    await broker.declare(settings)
    keys = [f"held-{n}" for n in range(20)]
    now_ms = int(time.time() * 1000)
    for key in keys:
        await park_directly(broker, names.conflict_queue, key, now_ms)

    async def conflict_depth_is(count: int) -> bool:
        return await broker.depth(names.conflict_queue) == count

    with processes() as started:
        started.append(worker(settings, tmp_path / "first.log", ledger))
        await eventually(lambda: conflict_depth_is(0), 30, "every message held by the worker")
        started[0].signal(signal.SIGKILL)
        await eventually(lambda: conflict_depth_is(len(keys)), 30, "held messages handed back")
        # Stamped long ago for the next worker: due at once.
        quick = consumer_settings(queue_type=queue_type, conflict_delay=0.5)
        started.append(worker(quick, tmp_path / "second.log", ledger))

        async def all_done() -> bool:
            return all([await status_is(store, key, Status.COMPLETED) for key in keys])

        await eventually(all_done, 40, "every held key completed")
        started[1].signal(signal.SIGTERM)
        assert await started[1].wait() == 0
    assert sum((await broker.depths(settings)).values()) == 0
    for key in keys:
        assert len(runs(ledger, key)) == 1, key


async def test_a_delay_message_handed_back_often_is_published_anew_not_dropped(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    """Returns count against a quorum delay queue's delivery limit: a worker
    stopping with the message in hand is one. At the limit the broker drops it."""
    held = consumer_settings(conflict_delay=60.0)
    names = Topology(held.queue)
    await broker.declare(held)
    await park_directly(broker, names.conflict_queue, "worn", int(time.time() * 1000))
    returned = await broker.return_times(names.conflict_queue, DELIVERY_LIMIT - 1)
    assert returned == DELIVERY_LIMIT - 1

    async def conflict_depth_is(count: int) -> bool:
        return await broker.depth(names.conflict_queue) == count

    for _ in range(2):  # workers stopping with it in hand: past the limit without a copy
        consumer = await start_consumer(held)
        await eventually(lambda: conflict_depth_is(0), 20, "held by the worker")
        assert await consumer.finish() == 0
        # A quorum queue takes back what a closed channel held a moment after
        # the close (RabbitMQ 4.0: about one close in twenty), so it is polled for.
        await eventually(lambda: conflict_depth_is(1), 20, "handed back, not dropped")
    consumer = await start_consumer(consumer_settings(conflict_delay=0.2))
    await eventually(lambda: status_is(store, "worn", Status.COMPLETED), 20, "worn completed")
    await finished(consumer, broker, held, dead_letters=0)
    assert len(runs(ledger, "worn")) == 1

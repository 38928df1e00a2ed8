"""``semel dlq replay``'s destinations and options on the real broker: ``--to``, the
original route, the default exchange's route, ``--rate`` (alone, and behind many kept
letters), ``--dry-run``, the replay count across two replay/fail cycles with a real
worker, and ``--json``."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from semel.consumer import names
from semel.consumer.names import H_TURN, Reason, Topology
from semel.settings import Settings
from tests.conftest import SettingsFactory
from tests.consumer.conftest import FAST
from tests.consumer.harness import Broker, InProcessConsumer
from tests.tools.conftest import (
    KEY_HEADER,
    depth,
    drain,
    eventually,
    header,
    semel,
    semel_process,
    wait_for_depth,
)

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def settings(make_settings: SettingsFactory, rabbitmq_server: str) -> Settings:
    """A private topology, with the consumer tests' fast settings for the one test that
    runs a worker (its handler fails whatever a body's ``permanent`` says)."""
    run = uuid.uuid4().hex[:10]
    private = {"amqp_url": rabbitmq_server, "queue": f"t.replayopts.{run}"}
    return make_settings(**(FAST | private | {"exchange": f"t.replayopts.{run}.events"}))


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """Another producer's topic exchange, one queue bound for ``invoice.*``, one for
    ``order.*``; and ``to``, a queue bound to nothing, for ``--to``."""

    exchange: str
    invoices: str
    orders: str
    to: str


@pytest.fixture
async def elsewhere(
    connection: AbstractConnection, settings: Settings, declared: None
) -> AsyncIterator[Elsewhere]:
    channel = await connection.channel()
    exchange = await channel.declare_exchange(
        f"{settings.exchange}.other", aio_pika.ExchangeType.TOPIC, durable=True
    )
    made = Elsewhere(
        exchange.name,
        f"{settings.queue}.invoices",
        f"{settings.queue}.orders",
        f"{settings.queue}.to",
    )
    for name, binding in ((made.invoices, "invoice.*"), (made.orders, "order.*"), (made.to, None)):
        queue = await channel.declare_queue(name, durable=True)
        if binding is not None:
            await queue.bind(exchange, routing_key=binding)
    try:
        yield made
    finally:
        cleanup = await connection.channel()
        for name in (made.invoices, made.orders, made.to):
            await cleanup.queue_delete(name)
        await cleanup.exchange_delete(made.exchange)


def dlq_of(settings: Settings) -> str:
    return Topology(settings.queue).dead_letter_queue


async def letter(
    channel: AbstractChannel,
    settings: Settings,
    key: str,
    route: tuple[str, str] | None,
    *,
    reason: Reason = Reason.PERMANENT_ERROR,
    body: dict[str, Any] | None = None,
) -> aio_pika.Message:
    """Put a dead letter in ``Q.dlq`` as the worker writes one; ``route`` is the producer's
    exchange and routing key (``None``: a letter that names none)."""
    now = datetime.now(UTC)
    headers: dict[str, Any] = {
        KEY_HEADER: key,
        "x-context": "kept",
        names.H_REASON: reason.value,
        names.H_ERROR: f"RuntimeError: no for {key}",
        names.H_ATTEMPTS: 1,
        names.H_KEY: key,
        names.H_FIRST_SEEN: (now - timedelta(minutes=4)).isoformat(timespec="milliseconds"),
        names.H_DEAD_LETTERED_AT: (now - timedelta(minutes=3)).isoformat(timespec="milliseconds"),
        names.H_LETTER_ID: uuid.uuid4().hex,
    }
    if route is not None:
        headers[names.H_ORIGINAL_EXCHANGE], headers[names.H_ORIGINAL_ROUTING_KEY] = route
    message = aio_pika.Message(
        json.dumps(body or {"event": "order.paid", "order_id": key}).encode(),
        content_type="application/json",
        correlation_id=f"corr-{key}",
        message_id=f"mid-{key}",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers=headers,
    )
    dlx = await channel.get_exchange(Topology(settings.queue).dead_letter_exchange)
    await dlx.publish(message, names.DLQ_ROUTING_KEY, mandatory=True)
    return message


async def replay(settings: Settings, *args: str) -> str:
    done = await semel(settings, "dlq", "replay", *args)
    assert done.code == 0, done.stdout + done.stderr
    return done.stdout.strip()


async def listed(settings: Settings) -> list[dict[str, Any]]:
    done = await semel(settings, "dlq", "list", "--json")
    assert done.code == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)["dead_letters"]
    return rows


async def test_to_sends_every_copy_to_that_queue_only(
    settings: Settings, channel: AbstractChannel, elsewhere: Elsewhere
) -> None:
    routes = [(settings.exchange, "order.paid"), (elsewhere.exchange, "invoice.sent"),
              ("", settings.queue)]  # fmt: skip
    for n, route in enumerate(routes):
        await letter(channel, settings, f"to-{n}", route)
    await wait_for_depth(channel, dlq_of(settings), len(routes))
    assert await replay(settings, "--all", "--to", elsewhere.to) == "replayed 3, kept 0"
    await wait_for_depth(channel, elsewhere.to, len(routes))
    copies = await drain(channel, elsewhere.to)
    assert [header(m, KEY_HEADER) for m in copies] == ["to-0", "to-1", "to-2"]
    assert {(m.exchange, m.routing_key) for m in copies} == {("", elsewhere.to)}
    # The producer's route still travels with each copy.
    assert [header(m, names.H_ORIGINAL_EXCHANGE) for m in copies] == [r[0] for r in routes]
    for queue in (settings.queue, elsewhere.invoices, elsewhere.orders, dlq_of(settings)):
        assert await depth(channel, queue) == 0, queue


async def test_by_default_a_copy_goes_to_its_original_exchange_and_routing_key(
    settings: Settings, channel: AbstractChannel, elsewhere: Elsewhere
) -> None:
    await letter(channel, settings, "inv-1", (elsewhere.exchange, "invoice.sent"))
    await letter(channel, settings, "ord-1", (elsewhere.exchange, "order.created"))
    await wait_for_depth(channel, dlq_of(settings), 2)
    assert await replay(settings, "--all") == "replayed 2, kept 0"
    await wait_for_depth(channel, elsewhere.invoices, 1)
    await wait_for_depth(channel, elsewhere.orders, 1)
    (invoice,) = await drain(channel, elsewhere.invoices)
    (order,) = await drain(channel, elsewhere.orders)
    assert (invoice.exchange, invoice.routing_key) == (elsewhere.exchange, "invoice.sent")
    assert (order.exchange, order.routing_key) == (elsewhere.exchange, "order.created")
    assert (header(invoice, KEY_HEADER), header(order, KEY_HEADER)) == ("inv-1", "ord-1")
    assert await depth(channel, settings.queue) == 0
    assert await depth(channel, elsewhere.to) == 0


@pytest.mark.parametrize("named", [True, False], ids=["default-exchange", "no-route-recorded"])
async def test_a_letter_published_through_the_default_exchange_goes_to_the_work_queue(
    settings: Settings, channel: AbstractChannel, elsewhere: Elsewhere, named: bool
) -> None:
    route = ("", settings.queue) if named else None
    await letter(channel, settings, "direct", route)
    await wait_for_depth(channel, dlq_of(settings), 1)
    assert await replay(settings, "--all") == "replayed 1, kept 0"
    await wait_for_depth(channel, settings.queue, 1)
    (copy,) = await drain(channel, settings.queue)
    assert (copy.exchange, copy.routing_key) == ("", settings.queue)
    assert header(copy, KEY_HEADER) == "direct"
    assert await depth(channel, elsewhere.to) == 0


async def test_rate_paces_the_copies(
    settings: Settings, channel: AbstractChannel, elsewhere: Elsewhere
) -> None:
    """100 copies at 50/s: 99 gaps of 20 ms, 1.98 s from the first copy to the last,
    measured where they arrive (a lower bound only: a loaded machine is slower)."""
    count, rate = 100, 50
    for n in range(count):
        await letter(channel, settings, f"r-{n}", (settings.exchange, "order.paid"))
    await wait_for_depth(channel, dlq_of(settings), count)
    arrivals: list[float] = []

    async def arrived(message: AbstractIncomingMessage) -> None:
        arrivals.append(time.monotonic())

    to = await channel.get_queue(elsewhere.to)
    tag = await to.consume(arrived, no_ack=True)
    summary = await replay(settings, "--all", "--rate", str(rate), "--to", elsewhere.to)
    assert summary == f"replayed {count}, kept 0"

    async def all_arrived() -> bool:
        return len(arrivals) == count

    await eventually(all_arrived)
    await to.cancel(tag)
    assert arrivals[-1] - arrivals[0] >= 1.8


async def test_rate_holds_when_many_kept_letters_come_first(
    settings: Settings, channel: AbstractChannel, elsewhere: Elsewhere
) -> None:
    """1,000 kept letters, then 100 to replay at 100/s. The broker takes a channel's
    publishes in order: a copy sent while hundreds of kept letters' copies still wait
    for their confirm reaches its queue behind them, together with the copies sent
    after it, above the rate. No 10 copies in a row may arrive within half the 9 gaps
    between them. The command is a process of its own, so that it cannot hold up the
    consumer measuring the arrivals."""
    kept, count, rate = 1000, 100, 100
    for n in range(kept):
        await letter(channel, settings, f"k-{n}", None, reason=Reason.INVALID_BODY)
    for n in range(count):
        await letter(channel, settings, f"r-{n}", None, reason=Reason.MAX_ATTEMPTS)
    await wait_for_depth(channel, dlq_of(settings), kept + count)
    arrivals: list[float] = []

    async def arrived(message: AbstractIncomingMessage) -> None:
        arrivals.append(time.monotonic())

    to = await channel.get_queue(elsewhere.to)
    tag = await to.consume(arrived, no_ack=True)
    args = ("--reason", "max-attempts", "--rate", str(rate), "--to", elsewhere.to)
    done = await asyncio.to_thread(semel_process, settings, "dlq", "replay", *args)
    assert done.code == 0, done.stderr
    assert done.stdout.strip() == f"replayed {count}, kept {kept}"

    async def all_arrived() -> bool:
        return len(arrivals) == count

    await eventually(all_arrived)
    await to.cancel(tag)
    tightest = min(later - first for first, later in zip(arrivals, arrivals[9:], strict=False))
    assert tightest >= 0.5 * 9 / rate, f"10 copies arrived within {tightest * 1000:.0f} ms"


def snapshot(message: AbstractIncomingMessage | aio_pika.Message) -> tuple[Any, ...]:
    """What a letter is: its body, properties and headers, less what the broker adds on a
    delivery and the id of the turn that last copied it (bookkeeping of every turn)."""
    headers = {
        name: value
        for name, value in (message.headers or {}).items()
        if name not in names.BROKER_HEADERS and name != H_TURN
    }
    return (
        message.body, headers, message.message_id, message.correlation_id,
        message.content_type, message.delivery_mode,
    )  # fmt: skip


async def test_dry_run_changes_nothing_and_counts_by_destination(
    settings: Settings, channel: AbstractChannel, elsewhere: Elsewhere
) -> None:
    sent = [await letter(channel, settings, f"o-{n}", (settings.exchange, "order.paid"))
            for n in range(3)]  # fmt: skip
    sent.append(await letter(channel, settings, "inv", (elsewhere.exchange, "invoice.sent")))
    sent.append(await letter(channel, settings, "direct", ("", settings.queue)))
    await wait_for_depth(channel, dlq_of(settings), len(sent))

    text = await replay(settings, "--all", "--dry-run")
    plan = json.loads(await replay(settings, "--all", "--dry-run", "--json"))
    one = await replay(settings, "--key", "inv", "--dry-run", "--to", elsewhere.to)

    assert text == (
        f"would replay 5: 3 to {settings.exchange} / order.paid, "
        f"1 to {elsewhere.exchange} / invoice.sent, 1 to (default exchange) / {settings.queue}"
    )
    assert plan == {
        "replayed": 0, "kept": 5, "failed": 0, "reset": 0, "dry_run": True,
        "destinations": {f"{settings.exchange} / order.paid": 3,
                         f"{elsewhere.exchange} / invoice.sent": 1,
                         f"(default exchange) / {settings.queue}": 1},
    }  # fmt: skip
    assert one == f"would replay 1: 1 to (default exchange) / {elsewhere.to}"
    for queue in (settings.queue, elsewhere.invoices, elsewhere.orders, elsewhere.to):
        assert await depth(channel, queue) == 0, queue
    # The DLQ as it was published, letter by letter, in order, after three turns.
    left = await drain(channel, dlq_of(settings))
    assert [snapshot(m) for m in left] == [snapshot(m) for m in sent]


async def test_the_replay_count_goes_up_across_two_replay_and_fail_cycles(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel, declared: None
) -> None:
    """A real worker fails the replayed copy again each time; its dead letter carries
    the copy's ``x-semel-replays``, which ``list --json`` shows: 0, then 1, then 2."""
    body = {"event": "order.paid", "order_id": "twice", "permanent": "card declined"}
    await letter(channel, settings, "twice", (settings.exchange, "order.paid"), body=body)
    await wait_for_depth(channel, dlq_of(settings), 1)
    (first,) = await listed(settings)
    assert (first["key"], first["replays"]) == ("twice", 0)
    seen = [first]
    consumer = await InProcessConsumer(settings).start(Broker(connection, channel), settings)
    try:
        for cycle in (1, 2):
            assert await replay(settings, "--key", "twice") == "replayed 1, kept 0"

            async def failed_again() -> bool:
                rows = await listed(settings)
                return len(rows) == 1 and rows[0]["letter_id"] != seen[-1]["letter_id"]

            await eventually(failed_again, deadline=30)
            (row,) = await listed(settings)
            assert (row["key"], row["reason"], row["replays"]) == (
                "twice",
                "permanent-error",
                cycle,
            )
            seen.append(row)
    finally:
        assert await consumer.finish() == 0


async def test_replay_json_counts_what_went_where(
    settings: Settings, channel: AbstractChannel, elsewhere: Elsewhere
) -> None:
    for key in ("m-1", "m-2"):
        await letter(channel, settings, key, (settings.exchange, "order.paid"),
                     reason=Reason.MAX_ATTEMPTS)  # fmt: skip
    await letter(channel, settings, "bad", (elsewhere.exchange, "invoice.sent"),
                 reason=Reason.INVALID_BODY)  # fmt: skip
    await wait_for_depth(channel, dlq_of(settings), 3)
    answer = json.loads(await replay(settings, "--reason", "max-attempts", "--json"))
    assert answer == {
        "replayed": 2, "kept": 1, "failed": 0, "reset": 0, "dry_run": False,
        "destinations": {f"{settings.exchange} / order.paid": 2},
    }  # fmt: skip
    await wait_for_depth(channel, settings.queue, 2)
    assert await depth(channel, dlq_of(settings)) == 1
    assert await depth(channel, elsewhere.invoices) == 0

"""``semel dlq replay``'s destinations and options on the real broker: the original
route, ``--to``, ``--dry-run``, ``--rate``, the replay count, copies no queue takes,
a channel the broker closes midway, and two replays at once."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractQueue

from semel.consumer import names
from semel.consumer.broker import topology
from semel.consumer.letters.writing import LOCK_WAIT, writer_lock
from semel.consumer.names import Reason, Topology
from semel.consumer.plan import topology_of
from semel.settings import Settings
from tests.tools.conftest import (
    CONTEXT,
    KEY_HEADER,
    dead_letter,
    depth,
    drain,
    eventually,
    header,
    letters,
    publish_letter,
    read,
    report,
    semel,
    semel_process,
    wait_for_depth,
    wait_for_letters,
)

pytestmark = pytest.mark.timeout(90)


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """Another producer's topic exchange, with one queue bound for ``invoice.*``."""

    exchange: str
    queue: AbstractQueue


@pytest.fixture
async def declared(connection: AbstractConnection, settings: Settings) -> None:
    await topology.declare(connection, topology_of(settings))


@pytest.fixture
async def elsewhere(
    connection: AbstractConnection, settings: Settings, declared: None
) -> AsyncIterator[Elsewhere]:
    channel = await connection.channel()
    exchange = await channel.declare_exchange(
        f"{settings.exchange}.other", aio_pika.ExchangeType.TOPIC, durable=True
    )
    queue = await channel.declare_queue(f"{settings.queue}.bound", durable=True)
    await queue.bind(exchange, routing_key="invoice.*")
    yield Elsewhere(exchange.name, queue)
    cleanup = await connection.channel()
    await cleanup.queue_delete(queue.name)
    await cleanup.exchange_delete(exchange.name)


async def json_of(settings: Settings, *args: str) -> Any:
    done = await semel(settings, "dlq", *args, "--json")
    assert done.code == 0, done.stderr
    return json.loads(done.stdout)


async def test_a_copy_goes_to_its_original_exchange_with_its_routing_key(
    settings: Settings,
    channel: AbstractChannel,
    connection: AbstractConnection,
    elsewhere: Elsewhere,
) -> None:
    await dead_letter(
        channel, settings, "inv-1", Reason.PERMANENT_ERROR,
        exchange=elsewhere.exchange, routing_key="invoice.sent",
    )  # fmt: skip
    await dead_letter(channel, settings, "direct", Reason.PERMANENT_ERROR, exchange="")
    await wait_for_letters(connection, settings, 2)
    assert await json_of(settings, "replay", "--all") == report(replayed=2, kept=0)
    await wait_for_depth(channel, elsewhere.queue.name, 1)
    (copy,) = await drain(channel, elsewhere.queue.name)
    assert (copy.exchange, copy.routing_key) == (elsewhere.exchange, "invoice.sent")
    assert header(copy, KEY_HEADER) == "inv-1"
    assert header(copy, names.H_ORIGINAL_EXCHANGE) == elsewhere.exchange
    # One that came through the default exchange goes to the work queue by its name.
    await wait_for_depth(channel, settings.queue, 1)
    (straight,) = await drain(channel, settings.queue)
    assert (straight.exchange, straight.routing_key) == ("", settings.queue)
    assert header(straight, KEY_HEADER) == "direct"


async def test_to_sends_every_copy_to_that_queue(
    settings: Settings,
    channel: AbstractChannel,
    connection: AbstractConnection,
    elsewhere: Elsewhere,
) -> None:
    for key in ("t-1", "t-2"):
        await dead_letter(channel, settings, key, Reason.MAX_ATTEMPTS)
    await wait_for_letters(connection, settings, 2)
    to = elsewhere.queue.name
    assert await json_of(settings, "replay", "--all", "--to", to) == report(replayed=2, kept=0)
    await wait_for_depth(channel, to, 2)
    copies = await drain(channel, to)
    assert [header(m, KEY_HEADER) for m in copies] == ["t-1", "t-2"]
    assert {(m.exchange, m.routing_key) for m in copies} == {("", to)}
    assert header(copies[0], "x-context") == CONTEXT
    # The producer's route still travels with it, for the handler that picks by it.
    assert header(copies[0], names.H_ORIGINAL_ROUTING_KEY) == "order.paid"
    assert await depth(channel, settings.queue) == 0
    assert await letters(connection, settings) == []


async def test_dry_run_says_what_would_go_where_and_changes_nothing(
    settings: Settings,
    channel: AbstractChannel,
    connection: AbstractConnection,
    elsewhere: Elsewhere,
) -> None:
    for key in ("o-1", "o-2", "o-3"):
        await dead_letter(channel, settings, key, Reason.MAX_ATTEMPTS)
    await dead_letter(
        channel, settings, "inv-1", Reason.PERMANENT_ERROR,
        exchange=elsewhere.exchange, routing_key="invoice.sent",
    )  # fmt: skip
    await dead_letter(channel, settings, "gone", Reason.POISON, exchange=f"{settings.queue}.gone")
    before = await wait_for_letters(connection, settings, 5)

    # It takes no lock: it runs beside a command that holds it.
    async with writer_lock(connection, Topology(settings.queue)):
        plan = await json_of(settings, "replay", "--all", "--dry-run")
        text = await semel(settings, "dlq", "replay", "--reason", "max-attempts", "--dry-run")
    assert (plan["dry_run"], plan["replay"], plan["kept"], plan["archived"]) == (True, 5, 0, 0)
    # The largest first, then by exchange and routing key.
    assert plan["destinations"] == [
        {"exchange": settings.exchange, "routing_key": "order.paid", "count": 3, "exists": True},
        {"exchange": elsewhere.exchange, "routing_key": "invoice.sent", "count": 1,
         "exists": True},
        {"exchange": f"{settings.queue}.gone", "routing_key": "order.paid", "count": 1,
         "exists": False},
    ]  # fmt: skip
    assert isinstance(plan["groups"], list)
    largest = plan["groups"][0]
    assert (largest["reason"], largest["count"]) == ("max-attempts", 3)
    assert sum(g["count"] for g in plan["groups"]) == 5
    assert text.code == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == "dry run: would replay 3, keep 2"
    assert lines[1:3] == [
        "by destination:",
        f"       3  exchange {settings.exchange!r}, routing key 'order.paid'",
    ]
    assert lines[3] == "by group:"
    assert lines[4].split()[0] == "3"
    # Nothing sent, nothing ended, nothing reordered.
    after = await letters(connection, settings)
    assert [a.letter_id for a in after] == [b.letter_id for b in before]
    assert await depth(channel, settings.queue) == 0
    assert await depth(channel, elsewhere.queue.name) == 0


@pytest.mark.usefixtures("declared")
async def test_rate_paces_the_copies(
    settings: Settings, channel: AbstractChannel, connection: AbstractConnection
) -> None:
    count, rate = 6, 4.0
    for n in range(count):
        await dead_letter(channel, settings, f"r-{n}", Reason.INVALID_BODY)
    await wait_for_letters(connection, settings, count)
    started = time.monotonic()
    done = await semel(settings, "dlq", "replay", "--all", "--rate", f"{rate:g}/s")
    elapsed = time.monotonic() - started
    assert done.code == 0, done.stderr
    assert done.stdout.strip() == f"replayed {count}, kept 0"
    assert elapsed >= (count - 1) / rate  # a lower bound only: a loaded machine is slower
    await wait_for_depth(channel, settings.queue, count)
    for bad in ("0", "-1", "fast", "5/m"):
        refused = await semel(settings, "dlq", "replay", "--all", "--rate", bad)
        assert refused.code == 2, bad
        assert "--rate" in refused.stderr


@pytest.mark.usefixtures("declared")
async def test_the_replay_count_goes_up_with_every_replay(
    settings: Settings, channel: AbstractChannel, connection: AbstractConnection
) -> None:
    await dead_letter(channel, settings, "twice", Reason.MAX_ATTEMPTS)
    await wait_for_letters(connection, settings, 1)
    assert (await semel(settings, "dlq", "replay", "--all")).code == 0
    await wait_for_depth(channel, settings.queue, 1)
    (copy,) = await drain(channel, settings.queue)
    assert header(copy, names.H_REPLAYS) == 1
    # It fails again: the worker dead-letters it with the headers it came with.
    again = dict(copy.headers or {}) | {
        names.H_REASON: Reason.MAX_ATTEMPTS.value,
        names.H_ERROR: "RuntimeError: still no",
        names.H_KEY: "twice",
        names.H_ATTEMPTS: 5,
        names.H_DEAD_LETTERED_AT: datetime.now(UTC).isoformat(),
    }
    message = aio_pika.Message(copy.body, headers=again, message_id=copy.message_id)
    await publish_letter(channel, settings, message)
    listed = await json_of(settings, "list")
    (row,) = listed["dead_letters"]
    assert (row["key"], row["replays"]) == ("twice", 1)
    assert (await semel(settings, "dlq", "replay", "--key", "twice")).code == 0
    await wait_for_depth(channel, settings.queue, 1)
    (second,) = await drain(channel, settings.queue)
    assert header(second, names.H_REPLAYS) == 2
    assert header(second, "x-context") == CONTEXT


async def test_a_copy_no_queue_takes_fails_and_its_letter_stays(
    settings: Settings,
    channel: AbstractChannel,
    connection: AbstractConnection,
    elsewhere: Elsewhere,
) -> None:
    unroutable = await dead_letter(
        channel, settings, "nobody", Reason.PERMANENT_ERROR,
        exchange=elsewhere.exchange, routing_key="nobody.home",
    )  # fmt: skip
    missing = await dead_letter(
        channel, settings, "gone", Reason.PERMANENT_ERROR, exchange=f"{settings.queue}.gone"
    )
    await dead_letter(channel, settings, "fine", Reason.PERMANENT_ERROR)
    await wait_for_letters(connection, settings, 3)
    done = await semel(settings, "dlq", "replay", "--all", "--json")
    assert done.code == 1
    assert json.loads(done.stdout) == report(replayed=1, kept=0, failed=2) | {
        "missing": [f"{settings.queue}.gone"]
    }
    left = await letters(connection, settings)
    assert {letter.letter_id for letter in left} == {unroutable, missing}
    await wait_for_depth(channel, settings.queue, 1)  # the one that had somewhere to go
    text = await semel(settings, "dlq", "replay", "--all")
    assert text.code == 1
    assert text.stdout.strip() == (
        f"replayed 0, kept 0, failed 2; exchange '{settings.queue}.gone' not found"
    )


async def test_a_channel_closed_midway_loses_no_letter(
    settings: Settings,
    channel: AbstractChannel,
    connection: AbstractConnection,
    elsewhere: Elsewhere,
) -> None:
    """The destination exchange is deleted while the replay runs: the broker closes
    the copies' channel. Every letter is either still live or its copy arrived,
    and every letter recorded as replayed had its copy arrive."""
    keys = [f"inv-{n}" for n in range(20)]
    for key in keys:
        await dead_letter(
            channel, settings, key, Reason.PERMANENT_ERROR,
            exchange=elsewhere.exchange, routing_key="invoice.sent",
        )  # fmt: skip
    await wait_for_letters(connection, settings, len(keys))
    running = asyncio.create_task(semel(settings, "dlq", "replay", "--all", "--rate", "10"))

    async def some_arrived() -> bool:
        return await depth(channel, elsewhere.queue.name) >= 3

    await eventually(some_arrived, deadline=20)
    await channel.exchange_delete(elsewhere.exchange)
    done = await running
    assert done.code == 1
    assert "; stopped: " in done.stdout
    arrived = {header(m, KEY_HEADER) for m in await drain(channel, elsewhere.queue.name)}
    live = {letter.entry.key for letter in await letters(connection, settings)}
    assert live | arrived == set(keys)
    replayed = int(done.stdout.split()[1].rstrip(","))
    assert len(keys) - len(live) == replayed
    assert replayed <= len(arrived) < len(keys)
    assert (await read(connection, settings)).ended == replayed


@pytest.mark.usefixtures("declared")
async def test_a_second_replay_while_one_runs_is_refused(
    settings: Settings, channel: AbstractChannel, connection: AbstractConnection
) -> None:
    """The second waits for the lock a while (``log.LOCK_WAIT``: a killed command's
    lock goes when the broker notices its connection gone), then gives up; the
    first runs long past that."""
    count, rate = 40, 4
    assert (count - 1) / rate > LOCK_WAIT + 4
    for n in range(count):
        await dead_letter(channel, settings, f"c-{n}", Reason.INVALID_BODY)
    await wait_for_letters(connection, settings, count)
    # A process of its own: two in-process runs would share sys.stdout.
    first = asyncio.create_task(
        asyncio.to_thread(semel_process, settings, "dlq", "replay", "--all", "--rate", str(rate))
    )

    async def sending() -> bool:
        return await depth(channel, settings.queue) >= 1

    await eventually(sending, deadline=20)
    second = await semel(settings, "dlq", "replay", "--all")
    assert not first.done()
    assert second.code == 1
    assert "another `semel dlq` command" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    done = await first
    assert done.code == 0, done.stderr
    assert done.stdout.strip() == f"replayed {count}, kept 0"
    await wait_for_depth(channel, settings.queue, count)  # each once

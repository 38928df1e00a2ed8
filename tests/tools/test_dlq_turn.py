"""A turn of the DLQ on the real broker: order, arrivals, doubles, the window, the lock.

Each test turns a private quorum queue (or a private topology's ``Q.dlq``)
with :func:`semel.consumer.broker.turn.turn`, or runs the ``semel dlq``
commands, and checks what the queue holds afterwards.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, cast

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.abc import AbstractChannel as AbstractAmqpChannel
from aiormq.abc import DeliveredMessage
from aiormq.exceptions import ChannelNotFoundEntity
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from semel.consumer import names
from semel.consumer.broker.turn import (
    Action,
    Drop,
    Keep,
    Letter,
    Send,
    TurnReport,
    kept_copy,
    tail_properties,
    turn,
)
from semel.consumer.broker.turn_actions import Properties, kept_headers
from semel.consumer.names import Reason, Topology
from semel.settings import Settings
from tests.conftest import Rabbitmqctl
from tests.tools.conftest import (
    KEY_HEADER,
    dead_letter,
    depth,
    drain,
    eventually,
    header,
    semel,
    semel_process,
    wait_for_depth,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def dlq(rabbitmq_server: str) -> AsyncIterator[str]:
    """A private quorum queue, deleted afterwards."""
    name = f"t.turn.{uuid.uuid4().hex[:10]}.dlq"
    connection = await aio_pika.connect(rabbitmq_server)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        yield name
        await (await connection.channel()).queue_delete(name)


@pytest.fixture
async def link(rabbitmq_server: str) -> AsyncIterator[tuple[AbstractConnection, AbstractChannel]]:
    """A command's connection (the DLQ's lock goes with it) and its confirm channel."""
    connection = await aio_pika.connect(rabbitmq_server)
    async with connection:
        yield connection, await connection.channel(publisher_confirms=True, on_return_raises=True)


def letter(
    n: int,
    *,
    tag: str = "seed",
    with_id: bool = True,
    letter_id: str | None = None,
    message_id: str | None = None,
) -> aio_pika.Message:
    headers: dict[str, Any] = {names.H_REASON: "max-attempts", names.H_KEY: f"{tag}-{n}"}
    if with_id:
        headers[names.H_LETTER_ID] = letter_id or f"{tag}-{n}-{uuid.uuid4().hex}"
    return aio_pika.Message(
        json.dumps({"n": n}).encode(),
        message_id=message_id or f"{tag}-{n}",
        headers=headers,
        delivery_mode=2,
    )


async def seed(channel: AbstractChannel, queue: str, messages: list[aio_pika.Message]) -> None:
    """Publish ``messages`` in order, each confirmed."""
    for start in range(0, len(messages), 200):
        await asyncio.gather(
            *(channel.default_exchange.publish(m, queue) for m in messages[start : start + 200])
        )
    await wait_for_depth(channel, queue, len(messages))


async def reading(
    link: tuple[AbstractConnection, AbstractChannel], queue: str, *, window: int = 50
) -> tuple[TurnReport, list[tuple[str, str]]]:
    """One turn keeping every letter: what it saw, (message id, letter id) in order."""
    seen: list[tuple[str, str]] = []

    async def decide(letter: Letter) -> Action:
        seen.append((str(letter.message.message_id), letter.letter_id))
        return Keep()

    return await turn(*link, queue, decide, window=window), seen


def test_a_turns_copy_is_what_kept_copy_builds() -> None:
    """The turn builds its copies' properties straight from the delivery's (no
    ``aio_pika.Message`` each): the same as :func:`kept_copy`, which copy_message builds."""
    properties = Properties(
        content_type="application/json",
        content_encoding="utf-8",
        headers={"x-trace": "t", "x-gone": "g", names.DELIVERY_COUNT: 3, "x-death": []},
        delivery_mode=1,
        priority=3,
        correlation_id="corr",
        reply_to="reply",
        expiration="60000",
        message_id="mid",
        timestamp=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        message_type="order.paid",
        user_id="guest",
        app_id="shop",
    )
    deliver = Basic.Deliver(consumer_tag="c", delivery_tag=1, routing_key="q")
    header = ContentHeader(body_size=2, properties=properties)
    no_channel = cast(AbstractAmqpChannel, None)  # nothing is acked or published here
    message = aio_pika.IncomingMessage(DeliveredMessage(deliver, header, b"{}", no_channel))
    held = Letter(message, "an-id", 0)
    for keep in (Keep(), Keep(headers={"x-new": 1, "x-gone": None}, expiration=1500)):
        headers = kept_headers(held, keep)
        assert tail_properties(properties, headers, keep.expiration) == (
            kept_copy(held, keep).properties
        )
        assert headers[names.H_LETTER_ID] == "an-id"


async def test_order_and_ids_are_kept_turn_after_turn(
    dlq: str, link: tuple[AbstractConnection, AbstractChannel]
) -> None:
    """Letters written before ids (none carried) get the same derived id every turn."""
    count = 1200
    await seed(link[1], dlq, [letter(n, with_id=n % 2 == 0) for n in range(count)])
    order = [f"seed-{n}" for n in range(count)]
    first, seen = await reading(link, dlq)
    assert (first.depth, first.kept, first.doubles) == (count, count, 0)
    assert [mid for mid, _ in seen] == order
    for _ in range(2):
        report, again = await reading(link, dlq)
        assert report.kept == count
        assert again == seen  # the same letters, ids and order
    await wait_for_depth(link[1], dlq, count)


async def test_letters_arriving_during_a_turn_are_neither_taken_nor_lost(
    dlq: str, link: tuple[AbstractConnection, AbstractChannel], rabbitmq_server: str
) -> None:
    count, arriving, window = 600, 200, 50
    seeded = [f"seed-{n}" for n in range(count)]
    new = [f"new-{n}" for n in range(arriving)]
    await seed(link[1], dlq, [letter(n) for n in range(count)])
    other = await aio_pika.connect(rabbitmq_server)
    seen: list[str] = []

    async def decide(held: Letter) -> Action:
        seen.append(str(held.message.message_id))
        if held.index == 100:  # the dead-lettering goes on meanwhile
            producer = await other.channel(publisher_confirms=True)
            more = [letter(n, tag="new") for n in range(arriving)]
            await asyncio.gather(*(producer.default_exchange.publish(m, dlq) for m in more))
        return Keep()

    async with other:
        report = await turn(*link, dlq, decide, window=window)
    assert seen == seeded  # none of the new ones taken
    assert (report.kept, report.short, report.beyond) == (count, 0, 0)
    await wait_for_depth(link[1], dlq, count + arriving)
    _, after = await reading(link, dlq)
    mids = [mid for mid, _ in after]
    assert sorted(mids) == sorted(seeded + new)  # each once
    assert [m for m in mids if m.startswith("seed-")] == seeded
    assert [m for m in mids if m.startswith("new-")] == new


async def test_a_letter_copied_twice_is_one_letter_after_the_next_turn(
    dlq: str, link: tuple[AbstractConnection, AbstractChannel]
) -> None:
    """What a command killed between a copy's confirm and its letter's ack leaves: the
    letter and its copy. With an id, and (a letter from before ids) without one."""
    twice = [letter(0), letter(1, letter_id="one"), letter(2, with_id=False), letter(3)]
    twice += [letter(1, letter_id="one"), letter(2, with_id=False)]  # the copies, at the tail
    await seed(link[1], dlq, twice)
    report, seen = await reading(link, dlq)
    assert (report.depth, report.kept, report.doubles) == (6, 4, 2)
    _, after = await reading(link, dlq)
    assert [mid for mid, _ in after] == [f"seed-{n}" for n in range(4)]
    assert after == seen


async def test_never_more_than_the_window_unacknowledged(
    dlq: str, link: tuple[AbstractConnection, AbstractChannel], rabbitmqctl: Rabbitmqctl
) -> None:
    """Seen from the broker: its count of the queue's unacknowledged messages, asked
    while the turn holds a letter in hand at a few places."""
    count, window = 1500, 40
    await seed(link[1], dlq, [letter(n) for n in range(count)])
    observed: list[int] = []

    async def unacked() -> int:
        out = await rabbitmqctl("list_queues", "-q", "--no-table-headers", "name",
                                "messages_unacknowledged")  # fmt: skip
        counts = dict(line.split("\t") for line in out.splitlines() if "\t" in line)
        observed.append(int(counts[dlq]))
        return observed[-1]

    async def full() -> bool:
        # The broker fills the prefetch while the turn waits: never past it.
        return await unacked() == window

    async def decide(letter: Letter) -> Action:
        if letter.index in (0, 700, count - 1):
            await eventually(full, deadline=30)
        return Keep()

    report = await turn(*link, dlq, decide, window=window)
    assert report.kept == count
    await wait_for_depth(link[1], dlq, count)

    async def none() -> bool:  # the broker's count follows the acks a moment later
        return await unacked() == 0

    await eventually(none, deadline=30)
    assert max(observed) == window, observed


async def test_a_queue_holding_fewer_than_its_depth_said_loses_nothing(
    dlq: str, link: tuple[AbstractConnection, AbstractChannel], rabbitmq_server: str
) -> None:
    """Another consumer takes a letter while the turn runs: the broker then has one of
    the turn's own copies to deliver within the depth. Taken for a second copy of
    its letter, it was dropped, and that letter lost; the turn now ends there and
    copies it to the tail once more."""
    count, window = 12, 4
    await seed(link[1], dlq, [letter(n) for n in range(count)])
    other = await aio_pika.connect(rabbitmq_server)
    taken: list[str] = []

    async def decide(letter: Letter) -> Action:
        if letter.index == 0:  # an operator's own consumer, say
            stolen = await (await other.channel()).get_queue(dlq, ensure=False)
            message = await stolen.get(no_ack=True)
            taken.append(str(message.message_id))
        return Keep()

    async with other:
        report = await turn(*link, dlq, decide, window=window)
    assert taken == [f"seed-{window}"]  # the first beyond the prefetch
    assert (report.kept, report.short, report.beyond) == (count, 1, 1)
    await wait_for_depth(link[1], dlq, count - 1)
    _, after = await reading(link, dlq)
    # Each once; the letter whose copy came round is now the last.
    rest = [f"seed-{n}" for n in range(1, count) if n != window]
    assert [mid for mid, _ in after] == [*rest, "seed-0"]


async def test_a_turn_that_removes_every_letter_ends_when_the_queue_runs_short(
    dlq: str, link: tuple[AbstractConnection, AbstractChannel], rabbitmq_server: str
) -> None:
    """No copy comes round when every letter is dropped: the turn asks the broker."""
    await seed(link[1], dlq, [letter(n) for n in range(5)])
    other = await aio_pika.connect(rabbitmq_server)

    async def decide(letter: Letter) -> Action:
        if letter.index == 0:
            stolen = await (await other.channel()).get_queue(dlq, ensure=False)
            await stolen.get(no_ack=True)
        return Drop()

    async with other:
        report = await turn(*link, dlq, decide, window=2)
    assert (report.dropped, report.short) == (4, 1)
    assert await depth(link[1], dlq) == 0


async def test_a_returned_send_is_told_apart_from_a_copy_with_its_message_id(
    dlq: str, link: tuple[AbstractConnection, AbstractChannel]
) -> None:
    """aiormq matches a returned message to the latest publish of its message id. A
    letter sent nowhere (returned) beside a kept letter of the same message: the
    return was taken for the kept copy's (the turn failed) and the kept copy's
    confirm for the send's, so the sent letter was acked, its only copy dropped."""
    pairs = 20
    both = [
        letter(n, tag=t, message_id=f"pair-{n}") for n in range(pairs) for t in ("send", "keep")
    ]
    await seed(link[1], dlq, both)
    nowhere = f"{dlq}.nowhere"
    await link[1].declare_exchange(nowhere, aio_pika.ExchangeType.DIRECT, auto_delete=False)

    async def decide(held: Letter) -> Action:
        if str((held.message.headers or {})[names.H_KEY]).startswith("send-"):
            copy = aio_pika.Message(held.message.body, message_id=held.message.message_id)
            return Send(copy, nowhere, "unbound")
        return Keep()

    try:
        report = await turn(*link, dlq, decide, window=10)
    finally:
        await (await link[0].channel()).exchange_delete(nowhere)
    assert (report.sent, report.refused, report.kept) == (0, pairs, 2 * pairs)
    await wait_for_depth(link[1], dlq, 2 * pairs)


@pytest.mark.usefixtures("declared")
async def test_the_lock_refuses_a_second_command_until_the_first_connection_closes(
    settings: Settings, channel: AbstractChannel, rabbitmq_server: str
) -> None:
    dlq_name = Topology(settings.queue).dead_letter_queue
    for key in ("k-1", "k-2"):
        await dead_letter(channel, settings, key, Reason.MAX_ATTEMPTS)
    await wait_for_depth(channel, dlq_name, 2)
    first = await aio_pika.connect(rabbitmq_server)
    holding, release = asyncio.Event(), asyncio.Event()

    async def decide(letter: Letter) -> Action:
        holding.set()
        await release.wait()
        return Keep()

    async with first:
        turning = asyncio.create_task(
            turn(first, await first.channel(publisher_confirms=True), dlq_name, decide)
        )
        await holding.wait()
        for command in (["dlq", "list"], ["dlq", "replay", "--all"]):
            refused = await asyncio.to_thread(semel_process, settings, *command)
            assert refused.code == 1
            assert refused.stderr.strip().splitlines() == [
                f"semel: error: another semel dlq command is running on {dlq_name} "
                f"(it holds {dlq_name}.lock)"
            ]
        release.set()
        assert (await turning).kept == 2
        held = await first.channel()
        await held.declare_queue(f"{dlq_name}.lock", passive=True)  # held until it closes

    async def lock_gone() -> bool:
        probe = await aio_pika.connect(rabbitmq_server)
        try:
            await (await probe.channel()).declare_queue(f"{dlq_name}.lock", passive=True)
        except ChannelNotFoundEntity:
            return True
        finally:
            await probe.close()
        return False

    await eventually(lock_gone)
    done = await semel(settings, "dlq", "list", "--json")
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout)["depth"] == 2


LISTINGS = 25  # more than RabbitMQ 4's default delivery limit of 20


@pytest.mark.usefixtures("declared")
async def test_listing_again_and_again_never_counts_a_return(
    settings: Settings, channel: AbstractChannel
) -> None:
    """RabbitMQ 4 counts every return against a quorum queue's delivery limit (20 by
    default): a listing that handed letters back would wear them out. A turn acks
    each letter once its copy is confirmed, so none is ever returned."""
    dlq_name = Topology(settings.queue).dead_letter_queue
    keys = [f"k-{n}" for n in range(3)]
    for key in keys:
        await dead_letter(channel, settings, key, Reason.MAX_ATTEMPTS)
    await wait_for_depth(channel, dlq_name, len(keys))
    ids: set[str] = set()
    for listing in range(LISTINGS):
        done = await semel(settings, "dlq", "list", "--json")
        assert done.code == 0, done.stderr
        shown = json.loads(done.stdout)
        assert shown["depth"] == len(keys), f"listing {listing + 1}: {shown['depth']} left"
        assert [row["key"] for row in shown["dead_letters"]] == keys  # in order
        ids |= {row["letter_id"] for row in shown["dead_letters"]}
    assert len(ids) == len(keys)  # each letter one id throughout
    letters = await drain(channel, dlq_name)
    assert [header(m, names.H_KEY) for m in letters] == keys
    assert all((m.headers or {}).get(names.DELIVERY_COUNT, 0) == 0 for m in letters)


@pytest.mark.usefixtures("declared")
async def test_a_replay_nowhere_leaves_the_letters_and_exits_1(
    settings: Settings, channel: AbstractChannel
) -> None:
    """A producer's exchange that no longer exists (every other letter's), and a --to
    queue that does not: those letters stay, the others go. A publish to a missing
    exchange closes its channel: the turn asks first, on a channel of its own."""
    dlq_name = Topology(settings.queue).dead_letter_queue
    gone = f"t.gone.{uuid.uuid4().hex[:10]}"
    keys = [f"k-{n}" for n in range(6)]
    for n, key in enumerate(keys):
        # Every other one as if its producer's exchange had since been deleted.
        exchange = gone if n % 2 else settings.exchange
        await dead_letter(channel, settings, key, Reason.MAX_ATTEMPTS, exchange=exchange)
    await wait_for_depth(channel, dlq_name, len(keys))
    nowhere = await semel(settings, "dlq", "replay", "--all", "--to", f"{gone}.q", "--json")
    assert nowhere.code == 1
    assert json.loads(nowhere.stdout)["failed"] == len(keys)
    await wait_for_depth(channel, dlq_name, len(keys))

    done = await semel(settings, "dlq", "replay", "--all", "--json")
    assert done.code == 1
    counts = json.loads(done.stdout)
    assert (counts["replayed"], counts["failed"]) == (3, 3)
    await wait_for_depth(channel, settings.queue, 3)
    sent = await drain(channel, settings.queue)
    assert [header(m, KEY_HEADER) for m in sent] == keys[0::2]
    await wait_for_depth(channel, dlq_name, 3)
    left = await drain(channel, dlq_name)
    assert [header(m, names.H_KEY) for m in left] == keys[1::2]

"""A running worker's keeper copies week-old dead letters forward, one keeper at a time."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection

from semel.consumer.broker.copies import new_letter_id, stream_safe_headers
from semel.consumer.broker.topology import declare
from semel.consumer.letters.keeper import keep_once, keep_periodically
from semel.consumer.letters.log import read_log
from semel.consumer.letters.writing import writer_lock
from semel.consumer.names import DLQ_ROUTING_KEY, Topology
from semel.consumer.plan import topology_of
from semel.settings import Settings
from tests.tools.conftest import eventually

pytestmark = pytest.mark.timeout(60)


async def _letter(channel: AbstractChannel, names: Topology, key: str, age: timedelta) -> str:
    headers = stream_safe_headers(
        {
            "x-semel-reason": "max-attempts",
            "x-semel-key": key,
            "x-semel-dead-lettered-at": (datetime.now(UTC) - age).isoformat(),
        }
    )
    letter_id = headers["x-semel-letter-id"] = new_letter_id()
    dlx = await channel.get_exchange(names.dead_letter_exchange)
    await dlx.publish(aio_pika.Message(b"{}", headers=headers), DLQ_ROUTING_KEY)
    return letter_id


async def test_the_keeper_carries_old_letters_forward_and_leaves_new_ones(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    await declare(connection, topology_of(settings))
    names = Topology(settings.queue)
    old = await _letter(channel, names, "old", timedelta(days=10))
    new = await _letter(channel, names, "new", timedelta(hours=1))
    keeper = asyncio.create_task(keep_periodically(connection, [names], None, interval=0.2))
    try:

        async def carried() -> bool:
            state = await read_log(connection, names)
            return datetime.now(UTC) - state.letters[old].written_at < timedelta(minutes=1)

        await eventually(carried, deadline=20)
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
    state = await read_log(connection, names)
    assert sorted(str(letter.entry.key) for letter in state.live()) == ["new", "old"]
    assert datetime.now(UTC) - state.letters[new].written_at > timedelta(minutes=59)
    assert state.records >= 3  # two letters and one carried copy, marks besides


async def test_a_keeper_skips_the_round_while_another_command_holds_the_lock(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    await declare(connection, topology_of(settings))
    names = Topology(settings.queue)
    await _letter(channel, names, "old", timedelta(days=10))
    other = await aio_pika.connect(settings.amqp_url)
    async with other, writer_lock(other, names):
        assert await keep_once(connection, names, None) is None
    assert await keep_once(connection, names, None) == 1

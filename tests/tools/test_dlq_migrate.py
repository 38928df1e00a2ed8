"""``semel dlq migrate``: an earlier version's ``Q.dlq`` moved into the stream, each letter once."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import aio_pika
import pytest
from aio_pika.abc import AbstractConnection, FieldValue
from aiormq.exceptions import ChannelNotFoundEntity

from semel.consumer import names
from semel.consumer.names import DLQ_ROUTING_KEY, Reason, Topology
from semel.settings import Settings
from tests.conftest import settings_env
from tests.tools.conftest import KEY_HEADER, letters, semel

pytestmark = pytest.mark.timeout(120)

CONTEXT: dict[str, FieldValue] = {"tenant": "t-1", "tags": ["a", "b"]}  # a table holding an array


async def old_queue(connection: AbstractConnection, settings: Settings, count: int) -> list[str]:
    """``Q.dlq`` as an earlier version made it (a quorum queue bound to ``Q.dlx`` with
    ``dlq``) holding ``count`` dead letters as its worker wrote them; their keys."""
    names_ = Topology(settings.queue)
    channel = await connection.channel(publisher_confirms=True)
    dlx = await channel.declare_exchange(
        names_.dead_letter_exchange, aio_pika.ExchangeType.DIRECT, durable=True
    )
    queue = await channel.declare_queue(
        names_.dead_letter_queue, durable=True, arguments={"x-queue-type": "quorum"}
    )
    await queue.bind(dlx, DLQ_ROUTING_KEY)
    keys = [f"old-{n}" for n in range(count)]
    now = datetime.now(UTC)
    for start in range(0, count, 250):
        sends = []
        for key in keys[start : start + 250]:
            headers: dict[str, FieldValue] = {
                KEY_HEADER: key,
                "x-context": CONTEXT,
                "x-amount": Decimal("9.90"),  # a stream would close the connection on it
                names.H_REASON: Reason.MAX_ATTEMPTS.value,
                names.H_KEY: key,
                names.H_ERROR: f"RuntimeError: no for {key}",
                names.H_ATTEMPTS: 5,
                names.H_ORIGINAL_EXCHANGE: settings.exchange,
                names.H_ORIGINAL_ROUTING_KEY: "order.paid",
                names.H_DEAD_LETTERED_AT: (now - timedelta(days=2)).isoformat(),
                "x-death": [{"queue": settings.queue, "reason": "rejected", "count": 1}],
            }
            message = aio_pika.Message(
                json.dumps({"order_id": key, "pad": "x" * 400}).encode(),
                headers=headers,
                message_id=f"mid-{key}",
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            sends.append(dlx.publish(message, DLQ_ROUTING_KEY))
        await asyncio.gather(*sends)
    await channel.close()
    return keys


def last_json(stdout: str) -> dict[str, object]:
    # The topology's warning about the old queue may come first on stdout.
    found = json.loads(stdout.splitlines()[-1])
    assert isinstance(found, dict)
    return found


async def old_queue_depth(connection: AbstractConnection, settings: Settings) -> int | None:
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(
            Topology(settings.queue).dead_letter_queue, passive=True
        )
    except ChannelNotFoundEntity:
        return None
    count = queue.declaration_result.message_count or 0
    await channel.close()
    return count


async def test_migrate_moves_every_dead_letter_once_with_its_headers_and_deletes_the_queue(
    settings: Settings, connection: AbstractConnection
) -> None:
    keys = await old_queue(connection, settings, 60)
    done = await semel(settings, "dlq", "migrate", "--json")
    assert done.code == 0, done.stderr
    assert last_json(done.stdout) | {"carried": 0} == {
        "found": True,
        "moved": 60,
        "deleted": True,
        "carried": 0,
    }
    moved = await letters(connection, settings)
    assert sorted(str(letter.entry.key) for letter in moved) == sorted(keys)
    for letter in moved:
        assert letter.producer_headers() == {
            KEY_HEADER: letter.entry.key,
            "x-context": CONTEXT,
            "x-amount": Decimal("9.90"),
        }
        assert "x-death" not in letter.headers
        assert letter.properties["message_id"] == f"mid-{letter.entry.key}"
        assert (letter.entry.reason, letter.entry.attempts) == ("max-attempts", 5)
        assert len(letter.letter_id) == 32
    assert await old_queue_depth(connection, settings) is None
    again = await semel(settings, "dlq", "migrate")
    assert again.code == 0, again.stderr
    assert "nothing to move" in again.stdout


async def test_migrate_keeps_the_emptied_queue_when_asked(
    settings: Settings, connection: AbstractConnection
) -> None:
    await old_queue(connection, settings, 3)
    done = await semel(settings, "dlq", "migrate", "--keep-queue")
    assert done.code == 0, done.stderr
    assert "Moved 3 dead letters" in done.stdout
    assert await old_queue_depth(connection, settings) == 0
    assert len(await letters(connection, settings)) == 3


LETTERS = 6000


async def test_a_migration_killed_midway_and_run_again_keeps_each_letter_once(
    settings: Settings, connection: AbstractConnection
) -> None:
    keys = await old_queue(connection, settings, LETTERS)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "semel.consumer.commands.app", "dlq", "migrate"),
        env=settings_env(settings),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        # Ready messages leave Q.dlq as they are delivered, at most a prefetch (200)
        # ahead of their acks, and each ack follows its confirmed copy: 600 fewer
        # means hundreds are in the stream and the rest still to come.
        end = time.monotonic() + 60
        while (await old_queue_depth(connection, settings) or 0) > LETTERS - 600:
            assert process.returncode is None, "the migration ended before it could be killed"
            assert time.monotonic() < end, "the migration never started"
            await asyncio.sleep(0.02)
        assert process.returncode is None, "the migration ended before it could be killed"
        process.send_signal(signal.SIGKILL)
        await asyncio.wait_for(process.wait(), 10)
    finally:
        if process.returncode is None:
            process.kill()
            await asyncio.wait_for(process.wait(), 10)
    partial = await letters(connection, settings)
    assert 0 < len(partial) < LETTERS, len(partial)
    done = await semel(settings, "dlq", "migrate", "--json")
    assert done.code == 0, done.stderr
    assert last_json(done.stdout)["deleted"] is True
    moved = Counter(str(letter.entry.key) for letter in await letters(connection, settings))
    assert set(moved) == set(keys)
    assert max(moved.values()) == 1
    assert await old_queue_depth(connection, settings) is None

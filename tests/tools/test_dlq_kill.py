"""``semel dlq list`` and ``replay`` killed at random moments lose no dead letter.

Each command runs as its own process and is sent SIGKILL at a moment drawn from
a seeded RNG (``SEMEL_TEST_KILL_SEED`` replays a run; every failure names the
seed and the moments). After each kill one more turn of the DLQ runs, and then
every letter is in the DLQ exactly once, or (a replay) its copy was confirmed
in the target queue and the letter is gone.

Timing-bound (a kill must land while a turn runs): it runs once, in the serial
phase (the Makefile's ``SERIAL_TESTS``), not beside other test workers.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.exceptions import ChannelLockedResource, ChannelNotFoundEntity

from semel.consumer import names
from semel.consumer.broker.turn import Action, Keep, Letter, LockHeld, TurnReport, turn
from semel.consumer.names import Reason, Topology
from semel.settings import Settings
from tests.conftest import settings_env
from tests.tools.conftest import KEY_HEADER, drain, eventually, wait_for_depth

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

LETTERS = 2000
KILLS = 3  # of each command
RATE = 400  # replayed copies a second
SEMEL = (sys.executable, "-m", "semel.consumer.commands.app")


@pytest.fixture
def kill_seed() -> int:
    return int(os.environ.get("SEMEL_TEST_KILL_SEED") or secrets.randbits(32))


@pytest.fixture
def rng(kill_seed: int) -> random.Random:
    return random.Random(kill_seed)


@pytest.fixture
def seed_of(kill_seed: int) -> str:
    """How to run the same moments again, for every failure message."""
    return f"SEMEL_TEST_KILL_SEED={kill_seed}"


@pytest.fixture
async def target(connection: AbstractConnection) -> AsyncIterator[str]:
    """Where the replays send their copies; deleted afterwards."""
    name = f"t.kill.{uuid.uuid4().hex[:10]}"
    channel = await connection.channel()
    await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
    yield name
    await (await connection.channel()).queue_delete(name)


async def seed_letters(channel: AbstractChannel, settings: Settings) -> list[str]:
    """``LETTERS`` dead letters as the worker writes them, through Q.dlx, confirmed."""
    keys = [f"k-{n:04d}" for n in range(LETTERS)]
    dlx = await channel.get_exchange(Topology(settings.queue).dead_letter_exchange)
    body = json.dumps({"event": "order.paid", "note": "n" * 200}).encode()

    def letter(key: str) -> aio_pika.Message:
        headers: dict[str, Any] = {
            KEY_HEADER: key,
            names.H_KEY: key,
            names.H_REASON: Reason.MAX_ATTEMPTS.value,
            names.H_ERROR: "RuntimeError: payment service said no",
            names.H_ATTEMPTS: 5,
            names.H_LETTER_ID: uuid.uuid4().hex,
        }
        return aio_pika.Message(body, headers=headers, message_id=f"mid-{key}", delivery_mode=2)

    for start in range(0, LETTERS, 250):
        batch = keys[start : start + 250]
        await asyncio.gather(*(dlx.publish(letter(k), names.DLQ_ROUTING_KEY) for k in batch))
    await wait_for_depth(channel, Topology(settings.queue).dead_letter_queue, LETTERS)
    return keys


async def one_turn(settings: Settings) -> tuple[TurnReport, list[str]]:
    """A turn keeping every letter, on a connection of its own (closed after: the lock
    goes with it), once the killed command's lock is gone; the keys it read, in order."""
    dlq_name = Topology(settings.queue).dead_letter_queue
    read: list[str] = []

    async def decide(letter: Letter) -> Action:
        read.append(str((letter.message.headers or {})[names.H_KEY]))
        return Keep()

    deadline = time.monotonic() + 30
    while True:
        connection = await aio_pika.connect(settings.amqp_url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            try:
                return await turn(connection, channel, dlq_name, decide), read
            except LockHeld:
                if time.monotonic() > deadline:
                    raise
        await asyncio.sleep(0.05)  # the broker drops a killed process's lock on its own


async def locked(connection: AbstractConnection, dlq_name: str) -> bool:
    """Whether a command holds the DLQ's lock (another connection's exclusive queue)."""
    probe = await connection.channel()
    try:
        await probe.declare_queue(f"{dlq_name}.lock", passive=True)
    except ChannelNotFoundEntity:
        return False
    except ChannelLockedResource:
        return True
    await probe.close()
    return True


async def kill_midway(
    settings: Settings,
    connection: AbstractConnection,
    rng: random.Random,
    within: float,
    *args: str,
) -> str:
    """Start ``semel *args``, SIGKILL it at most ``within`` seconds after its turn took
    the lock; what happened, for the failure messages."""
    dlq_name = Topology(settings.queue).dead_letter_queue
    process = await asyncio.create_subprocess_exec(
        *SEMEL,
        *args,
        env=settings_env(settings),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:

        async def started() -> bool:
            return process.returncode is not None or await locked(connection, dlq_name)

        await eventually(started, deadline=30)
        moment = rng.uniform(0.0, within)
        await asyncio.sleep(moment)  # the random moment is the point of the test
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        _, stderr = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode in (-signal.SIGKILL, 0), stderr.decode()
    outcome = "killed" if process.returncode else "done"
    return f"{' '.join(args)}: {outcome} {moment:.3f}s after the lock"


@pytest.mark.usefixtures("declared")
async def test_listing_killed_at_any_moment_loses_and_doubles_nothing(
    settings: Settings,
    channel: AbstractChannel,
    connection: AbstractConnection,
    rng: random.Random,
    seed_of: str,
) -> None:
    keys = await seed_letters(channel, settings)
    moments: list[str] = []
    for _ in range(KILLS):
        # A turn of 2,000 letters takes about a second.
        listing = ("dlq", "list", "--limit", "1")
        moments.append(await kill_midway(settings, connection, rng, 1.0, *listing))
        repair, _ = await one_turn(settings)
        report, read = await one_turn(settings)
        why = f"{seed_of}; {moments}; repair turn {repair}"
        assert report.doubles == 0, why
        assert sorted(read) == keys, why  # each exactly once


@pytest.mark.usefixtures("declared")
async def test_replay_killed_at_any_moment_loses_and_doubles_nothing(
    settings: Settings,
    channel: AbstractChannel,
    connection: AbstractConnection,
    target: str,
    rng: random.Random,
    seed_of: str,
) -> None:
    keys = await seed_letters(channel, settings)
    replay = ("dlq", "replay", "--all", "--to", target, "--rate", str(RATE))
    copied: Counter[str] = Counter()  # keys whose copy reached the target queue
    moments: list[str] = []
    for _ in range(KILLS):
        moments.append(await kill_midway(settings, connection, rng, 1.5, *replay))
        repair, _ = await one_turn(settings)
        report, read = await one_turn(settings)
        copied.update(str((m.headers or {})[KEY_HEADER]) for m in await drain(channel, target))
        why = f"{seed_of}; {moments}; repair turn {repair}"
        assert report.doubles == 0, why
        assert len(read) == len(set(read)), why  # none twice in the DLQ
        assert set(read) | set(copied) == set(keys), why  # none lost
    last = await asyncio.create_subprocess_exec(
        *SEMEL, *replay[:-2], env=settings_env(settings), stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(last.communicate(), 120)
    assert last.returncode == 0, stderr.decode()
    await wait_for_depth(channel, Topology(settings.queue).dead_letter_queue, 0)
    copied.update(str((m.headers or {})[KEY_HEADER]) for m in await drain(channel, target))
    assert set(copied) == set(keys), f"{seed_of}; {moments}"

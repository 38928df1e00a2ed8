"""The dead-letter commands killed at random points lose no letter and keep each once.

A replay is SIGKILLed at random moments (while it reads, while copies are in
flight, between a batch's confirms and its event), five times in a row, then
run to its end. At every stop, each letter is either still in the stream,
once, or recorded replayed with at least one confirmed copy in the work
queue; at the end every letter has gone out, and the extra copies are at most
one batch in flight per kill. A discard and a listing are killed the same
way. The seed is printed, so a failure can be run again as it was.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection

from semel.consumer.broker.copies import new_letter_id, stream_safe_headers
from semel.consumer.broker.topology import declare
from semel.consumer.letters.log import LogState, read_log
from semel.consumer.letters.replay import REPLAY_WINDOW
from semel.consumer.names import DLQ_ROUTING_KEY, Topology
from semel.consumer.plan import topology_of
from semel.settings import Settings
from tests.conftest import settings_env

LETTERS = 1500
KILLS = 5
pytestmark = pytest.mark.timeout(240)


async def _fill(channel: AbstractChannel, settings: Settings) -> list[str]:
    names = Topology(settings.queue)
    dlx = await channel.get_exchange(names.dead_letter_exchange)
    keys = [f"kill-{i}" for i in range(LETTERS)]
    for start in range(0, LETTERS, 250):
        batch = []
        for key in keys[start : start + 250]:
            headers = stream_safe_headers(
                {
                    "Idempotency-Key": key,
                    "x-semel-reason": "invalid-body",  # no store record: nothing to reset
                    "x-semel-key": key,
                    "x-semel-error": "bad body",
                    "x-semel-original-exchange": "",
                    "x-semel-original-routing-key": settings.queue,
                }
            )
            headers["x-semel-letter-id"] = new_letter_id()
            message = aio_pika.Message(json.dumps({"k": key}).encode(), headers=headers)
            batch.append(dlx.publish(message, DLQ_ROUTING_KEY))
        await asyncio.gather(*batch)
    return keys


def _start(settings: Settings, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "semel.consumer.commands.app", *args],
        env=settings_env(settings),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _kill_after(process: subprocess.Popen[bytes], delay: float) -> bool:
    """SIGKILL ``process`` after ``delay`` s; whether it was still running."""
    await asyncio.sleep(delay)
    if process.poll() is not None:
        return False
    os.kill(process.pid, signal.SIGKILL)
    await asyncio.to_thread(process.wait, 10)
    return True


async def _copies(channel: AbstractChannel, queue: str) -> Counter[str]:
    """Every copy in the work queue, by key (taken out: the test owns the queue)."""
    found: Counter[str] = Counter()
    declared = await channel.declare_queue(queue, passive=True)
    while (message := await declared.get(no_ack=True, fail=False)) is not None:
        found[str((message.headers or {}).get("Idempotency-Key"))] += 1
    return found


def _check(state: LogState, keys: list[str], sent: Counter[str]) -> None:
    live = Counter(letter.entry.key for letter in state.live())
    assert all(count == 1 for count in live.values()), "a letter shows twice"
    for key in keys:
        assert live[key] + (sent[key] > 0) >= 1, f"{key}: neither in the stream nor sent"


async def test_replay_killed_at_random_points_loses_no_letter(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    seed = random.randrange(1 << 32)
    print(f"seed {seed}")
    chance = random.Random(seed)
    await declare(connection, topology_of(settings))
    keys = await _fill(channel, settings)
    names = Topology(settings.queue)
    sent: Counter[str] = Counter()
    killed = 0
    for _ in range(KILLS):
        process = _start(settings, "dlq", "replay", "--all", "--rate", "600")
        killed += await _kill_after(process, chance.uniform(0.3, 3.5))
        sent += await _copies(channel, settings.queue)
        _check(await read_log(connection, names), keys, sent)
    last = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "semel.consumer.commands.app", "dlq", "replay", "--all"],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert last.returncode == 0, last.stderr
    sent += await _copies(channel, settings.queue)
    state = await read_log(connection, names)
    assert state.live() == [], "letters left after the full replay"
    assert set(sent) == set(keys), "a key was never sent"
    extra = sum(sent.values()) - len(keys)
    print(f"{killed} kills, {extra} extra copies")
    assert extra <= killed * REPLAY_WINDOW


async def test_discard_and_list_killed_at_random_points(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    seed = random.randrange(1 << 32)
    print(f"seed {seed}")
    chance = random.Random(seed)
    await declare(connection, topology_of(settings))
    keys = await _fill(channel, settings)
    names = Topology(settings.queue)
    for _ in range(3):
        await _kill_after(_start(settings, "dlq", "list", "--limit", "5"), chance.uniform(0.1, 1.5))
    state = await read_log(connection, names)
    assert sorted(str(letter.entry.key) for letter in state.live()) == sorted(keys)
    for _ in range(3):
        process = _start(settings, "dlq", "discard", "--all", "--yes", "--note", "test")
        await _kill_after(process, chance.uniform(0.1, 1.5))
        left = [letter.entry.key for letter in (await read_log(connection, names)).live()]
        assert len(left) == len(set(left)), "a letter shows twice"
        assert set(left) <= set(keys)

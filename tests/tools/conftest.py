"""Fixtures of the operator-command tests: a private topology per test on the real broker.

Dead letters live in the stream ``Q.dead-letters``: :func:`dead_letter` writes
one the way the worker does, and :func:`letters` reads them back the way
``semel dlq list`` does (a reading takes nothing away, so a test reads as
often as it likes).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from typer.testing import CliRunner

from semel.consumer import names
from semel.consumer.broker import topology
from semel.consumer.broker.copies import carried_headers, new_letter_id, stream_safe_headers
from semel.consumer.broker.publishing import Published, publish_confirmed
from semel.consumer.commands.app import app
from semel.consumer.letters.log import Letter, LogState, read_log
from semel.consumer.names import Reason, Topology
from semel.consumer.plan import topology_of
from semel.settings import Settings
from tests.conftest import SettingsFactory, settings_env


@pytest.fixture
def settings(make_settings: SettingsFactory, rabbitmq_server: str) -> Settings:
    """Settings naming a queue and an exchange that no other test uses."""
    run = uuid.uuid4().hex[:10]
    return make_settings(
        amqp_url=rabbitmq_server,
        queue=f"t.tools.{run}",
        exchange=f"t.tools.{run}.events",
        max_body_bytes=4096,  # keeps the too-large input small
    )


@pytest.fixture
async def connection(settings: Settings) -> AsyncIterator[AbstractConnection]:
    """A connection for looking at the broker; deletes the test's topology afterwards."""
    conn = await aio_pika.connect(settings.amqp_url)
    async with conn:
        yield conn
        channel = await conn.channel()
        names = Topology(settings.queue)
        for spec in topology.queue_specs(topology_of(settings)):
            await channel.queue_delete(spec.name)
        await channel.queue_delete(names.dead_letter_queue)  # an earlier version's, if made
        for exchange in (settings.exchange, names.retry_exchange, names.dead_letter_exchange):
            await channel.exchange_delete(exchange)


@pytest.fixture
async def channel(connection: AbstractConnection) -> AbstractChannel:
    return await connection.channel(publisher_confirms=True, on_return_raises=True)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a command did: its exit code and output."""

    code: int
    stdout: str
    stderr: str


_runner = CliRunner()


async def semel(settings: Settings, *args: str) -> Outcome:
    """Run a ``semel`` command in-process with ``settings`` as its environment.

    The command runs its own event loop, so it goes to a worker thread.
    """
    result = await asyncio.to_thread(_runner.invoke, app, list(args), env=settings_env(settings))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Outcome(result.exit_code, result.stdout, result.stderr)


def semel_process(settings: Settings, *args: str) -> Outcome:
    """Run ``semel`` as a separate process, the way an operator does."""
    proc = subprocess.run(
        [sys.executable, "-m", "semel.consumer.commands.app", *args],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


async def depth(channel: AbstractChannel, queue: str) -> int:
    """Ready messages in ``queue``, from a passive declare."""
    declared = await channel.declare_queue(queue, passive=True)
    return declared.declaration_result.message_count or 0


async def eventually(check: Callable[[], Awaitable[bool]], deadline: float = 10.0) -> None:
    """Poll ``check`` until it holds; fail after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while not await check():
        if time.monotonic() > end:
            pytest.fail(f"condition not met within {deadline}s")
        await asyncio.sleep(0.05)


async def wait_for_depth(channel: AbstractChannel, queue: str, expected: int) -> None:
    """Wait until ``queue`` holds ``expected`` ready messages (quorum queues lag a little)."""

    async def reached() -> bool:
        return await depth(channel, queue) == expected

    await eventually(reached)


async def drain(channel: AbstractChannel, queue: str) -> list[AbstractIncomingMessage]:
    """Take every ready message out of ``queue`` with basic.get, acking each."""
    taken: list[AbstractIncomingMessage] = []
    declared = await channel.declare_queue(queue, passive=True)
    while (message := await declared.get(no_ack=True, fail=False)) is not None:
        taken.append(message)
    return taken


def header(message: AbstractIncomingMessage, name: str) -> Any:
    return (message.headers or {}).get(name)


async def read(connection: AbstractConnection, settings: Settings) -> LogState:
    """The dead letters' stream folded, as the commands read it."""
    retention = settings.dlq_archive_retention
    return await read_log(connection, Topology(settings.queue), archive_retention=retention)


async def letters(connection: AbstractConnection, settings: Settings) -> list[Letter]:
    """The live dead letters, in stream order."""
    return (await read(connection, settings)).live()


async def wait_for_letters(
    connection: AbstractConnection, settings: Settings, expected: int, deadline: float = 15.0
) -> list[Letter]:
    """The live dead letters once there are ``expected`` of them; fail after ``deadline`` s."""
    end = time.monotonic() + deadline
    while True:
        found = await letters(connection, settings)
        if len(found) == expected:
            return found
        if time.monotonic() > end:
            pytest.fail(f"{len(found)} live dead letters, not {expected}, after {deadline:g}s")
        await asyncio.sleep(0.1)


def report(
    replayed: int, kept: int, failed: int = 0, reset: int = 0, archived: int = 0
) -> dict[str, object]:
    """``semel dlq replay --json``'s answer of a run that ran to its end."""
    counts = {"replayed": replayed, "kept": kept, "failed": failed, "reset": reset}
    return counts | {"archived": archived, "missing": [], "stopped": None}


KEY_HEADER = "Idempotency-Key"
FINGERPRINT = "f" * 64
# A producer's header a stream cannot keep as it is (a table holding an array):
# it travels inside x-semel-headers and a replay restores it.
CONTEXT = {"tenant": "t-1", "tags": ["a", "b"]}


async def publish_letter(
    channel: AbstractChannel, settings: Settings, message: aio_pika.Message
) -> str:
    """Dead-letter ``message`` the way the worker does: the broker's headers dropped,
    stream-safe headers, a new letter id, confirmed through Q.dlx. Its letter id."""
    headers = stream_safe_headers(carried_headers(message.headers or {}))
    letter_id = headers[names.H_LETTER_ID] = new_letter_id()
    message.headers = headers
    dlx = await channel.get_exchange(Topology(settings.queue).dead_letter_exchange, ensure=False)
    answer = await publish_confirmed(dlx, message, names.DLQ_ROUTING_KEY)
    assert answer is Published.CONFIRMED, answer
    return letter_id


async def dead_letter(
    channel: AbstractChannel,
    settings: Settings,
    key: str,
    reason: Reason,
    *,
    attempts: int = 5,
    age: timedelta = timedelta(minutes=3),
    exchange: str | None = None,
    routing_key: str = "order.paid",
    replays: int | None = None,
) -> str:
    """A dead letter as the worker writes it (see :func:`publish_letter`); its letter id.

    Its producer sent it to ``exchange`` (``SEMEL_EXCHANGE`` by default) with
    ``routing_key``.
    """
    now = datetime.now(UTC)
    headers: dict[str, Any] = {
        KEY_HEADER: key,
        "x-trace": "keep-me",
        "x-context": CONTEXT,
        names.H_REASON: reason.value,
        names.H_ERROR: f"RuntimeError: payment service said no to {key} " + "x" * 200,
        names.H_ATTEMPTS: attempts,
        names.H_KEY: key,
        names.H_ORIGINAL_EXCHANGE: settings.exchange if exchange is None else exchange,
        names.H_ORIGINAL_ROUTING_KEY: routing_key,
        names.H_FIRST_SEEN: (now - age - timedelta(seconds=30)).isoformat(),
        names.H_DEAD_LETTERED_AT: (now - age).isoformat(timespec="milliseconds"),
        "x-death": [{"queue": settings.queue, "reason": "rejected", "count": 1}],
        "x-first-death-queue": settings.queue,
    }
    if replays is not None:
        headers[names.H_REPLAYS] = replays
    message = aio_pika.Message(
        json.dumps({"event": "order.paid", "order_id": key, "amount": 1}).encode(),
        content_type="application/json",
        correlation_id=f"corr-{key}",
        app_id="shop",
        message_id=f"mid-{key}",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers=headers,
    )
    return await publish_letter(channel, settings, message)

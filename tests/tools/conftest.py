"""Fixtures of the operator-command tests: a private topology per test on the real broker."""

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
from semel.consumer.commands.app import app
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
        for exchange in (settings.exchange, names.retry_exchange, names.dead_letter_exchange):
            await channel.exchange_delete(exchange)


@pytest.fixture
async def declared(connection: AbstractConnection, settings: Settings) -> AsyncIterator[None]:
    """The test's topology; the audit queue some commands declare deleted after."""
    await topology.declare(connection, topology_of(settings))
    yield
    channel = await connection.channel()
    await channel.queue_delete(Topology(settings.queue).dead_letter_queue + ".audit")


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


KEY_HEADER = "Idempotency-Key"
FINGERPRINT = "f" * 64


async def dead_letter(
    channel: AbstractChannel,
    settings: Settings,
    key: str,
    reason: Reason,
    *,
    attempts: int = 5,
    age: timedelta = timedelta(minutes=3),
    routing_key: str = "order.paid",
    exchange: str | None = None,
) -> None:
    """Put a dead letter in Q.dlq the way the consumer does: confirmed, through Q.dlx.

    ``routing_key`` and ``exchange`` (``settings.exchange`` unless given) are the
    producer's route it records.
    """
    now = datetime.now(UTC)
    message = aio_pika.Message(
        json.dumps({"event": "order.paid", "order_id": key, "amount": 1}).encode(),
        content_type="application/json",
        correlation_id=f"corr-{key}",
        app_id="shop",
        message_id=f"mid-{key}",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers={
            KEY_HEADER: key,
            "x-trace": "keep-me",
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
        },
    )
    dlx = await channel.get_exchange(Topology(settings.queue).dead_letter_exchange)
    await dlx.publish(message, names.DLQ_ROUTING_KEY, mandatory=True)

"""Fixtures of the publisher tests: a private exchange and queue per test on the real broker."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aio_pika
import orjson
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

ROUTING_KEY = "order.paid"


@dataclass
class Place:
    """A topic exchange of the test's own, and a queue bound to it with ``#``."""

    url: str
    exchange: str
    queue: str
    channel: AbstractChannel  # for looking at the broker

    async def depth(self, queue: str | None = None) -> int:
        declared = await self.channel.declare_queue(queue or self.queue, passive=True)
        return int(declared.declaration_result.message_count or 0)

    async def taken(self, expected: int, queue: str | None = None) -> list[AbstractIncomingMessage]:
        """Wait for ``expected`` ready messages, then take them all (in queue order)."""
        await eventually(lambda: self._reached(expected, queue), 10, f"{expected} messages")
        declared = await self.channel.declare_queue(queue or self.queue, passive=True)
        messages = []
        while (message := await declared.get(no_ack=True, fail=False)) is not None:
            messages.append(message)
        return messages

    async def _reached(self, expected: int, queue: str | None) -> bool:
        return await self.depth(queue) == expected


def body_of(message: AbstractIncomingMessage) -> Any:
    return orjson.loads(message.body)


async def eventually(
    check: Callable[[], Awaitable[bool]], deadline: float = 10.0, what: str = "condition"
) -> None:
    """Poll ``check`` until it holds; fail the test after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while not await check():
        if time.monotonic() > end:
            pytest.fail(f"{what} not reached within {deadline:g}s")
        await asyncio.sleep(0.02)


@pytest.fixture
async def observer(rabbitmq_server: str) -> AsyncIterator[AbstractConnection]:
    connection = await aio_pika.connect(rabbitmq_server)
    async with connection:
        yield connection


@pytest.fixture
async def place(rabbitmq_server: str, observer: AbstractConnection) -> AsyncIterator[Place]:
    run = uuid.uuid4().hex[:10]
    channel = await observer.channel()
    exchange = await channel.declare_exchange(f"t.pub.{run}", aio_pika.ExchangeType.TOPIC)
    queue = await channel.declare_queue(f"t.pub.{run}")
    await queue.bind(exchange, "#")
    made = Place(rabbitmq_server, exchange.name, queue.name, channel)
    try:
        yield made
    finally:
        cleanup = await observer.channel()
        await cleanup.queue_delete(queue.name)
        await cleanup.exchange_delete(exchange.name)

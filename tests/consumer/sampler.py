"""Watching queue depths while a test runs, to see messages pass through delay queues.

The workers take a delay queue's messages as they arrive and hold them
unacknowledged until due, so its ready depth mostly stays 0: the sampler also
counts what the in-process consumers' delay consumers take from each queue.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aio_pika

from semel.consumer.broker.delays import DelayReturns
from semel.consumer.broker.topology import queue_specs
from semel.consumer.plan import topology_of
from semel.settings import Settings

SAMPLE_EVERY = 0.02  # seconds; delay queues hold a message for 0.2 s at the least


class DepthSampler:
    """The largest depth each of a test's queues reached."""

    def __init__(self) -> None:
        self.peak: dict[str, int] = {}

    def saw(self, queue: str) -> int:
        return self.peak.get(queue, 0)

    async def _sample(self, settings: Settings) -> None:
        names = [spec.name for spec in queue_specs(topology_of(settings))]
        async with await aio_pika.connect(settings.amqp_url) as connection:
            channel = await connection.channel()
            while True:
                for name in names:
                    declared = await channel.declare_queue(name, passive=True)
                    depth = int(declared.declaration_result.message_count or 0)
                    self.peak[name] = max(self.peak.get(name, 0), depth)
                await asyncio.sleep(SAMPLE_EVERY)


@contextlib.asynccontextmanager
async def sampling(settings: Settings) -> AsyncIterator[DepthSampler]:
    sampler = DepthSampler()
    task = asyncio.create_task(sampler._sample(settings))
    on_message = DelayReturns._on_message

    async def taken(self: DelayReturns, queue: Any, delivery: Any) -> None:
        sampler.peak[queue.name] = max(sampler.peak.get(queue.name, 0), 1)
        await on_message(self, queue, delivery)

    DelayReturns._on_message = taken  # type: ignore[method-assign]
    try:
        yield sampler
    finally:
        DelayReturns._on_message = on_message  # type: ignore[method-assign]
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

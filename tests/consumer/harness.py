"""What the end-to-end tests drive and observe: the broker, a consumer, a TCP proxy.

The broker is observed the way an operator would: queue depths from passive
declares and dead letters read back with basic.get, never the consumer's logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import orjson
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.exceptions import ChannelNotFoundEntity
from dependency_injector import providers

from semel.consumer.broker.topology import declare, queue_specs
from semel.consumer.commands.consume import run_consumer
from semel.consumer.container import Container
from semel.consumer.names import Topology
from semel.consumer.plan import topology_of
from semel.settings import Settings
from semel.stores.base import Store
from tests.conftest import settings_env
from tests.proxy import TcpProxy as TcpProxy  # re-exported: tests import it from here
from tests.servers import ROOT

ROUTING_KEY = "order.paid"


async def eventually(
    check: Callable[[], Awaitable[bool]], deadline: float = 15.0, what: str = "condition"
) -> None:
    """Poll ``check`` until it holds; fail the test after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while not await check():
        if time.monotonic() > end:
            pytest.fail(f"{what} not reached within {deadline:g}s")
        await asyncio.sleep(0.05)


@dataclass
class DeadLetter:
    """A message read back from ``Q.dlq``."""

    body: bytes
    headers: dict[str, Any]
    message_id: str | None
    content_type: str | None

    @property
    def reason(self) -> str:
        return str(self.headers["x-semel-reason"])

    @property
    def key(self) -> str:
        return str(self.headers["x-semel-key"])


class Broker:
    """A producer and an observer of one test's topology."""

    def __init__(self, connection: AbstractConnection, channel: AbstractChannel) -> None:
        self.connection = connection
        self.channel = channel
        # Every topology declared here, removed with the test's own: a test that
        # overrides its retry tiers declares queues its fixture's settings do not name.
        self._declared: list[Settings] = []

    @classmethod
    async def connect(cls, url: str) -> Broker:
        connection = await aio_pika.connect(url)
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        return cls(connection, channel)

    async def publish(
        self,
        settings: Settings,
        body: Any,
        *,
        key: Any = None,
        headers: dict[str, Any] | None = None,
        content_type: str | None = "application/json",
        message_id: str | None = None,
    ) -> None:
        """Publish like a producer would, confirmed; ``body`` other than bytes is JSON-encoded."""
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        all_headers = dict(headers or {})
        if key is not None:
            all_headers["Idempotency-Key"] = key
        exchange = await self.channel.get_exchange(settings.exchange, ensure=False)
        await exchange.publish(
            aio_pika.Message(
                raw,
                headers=all_headers,
                content_type=content_type,
                message_id=message_id,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key=ROUTING_KEY,
        )

    async def declare(self, settings: Settings) -> None:
        """Declare the topology as the consumer would, so a test can publish first."""
        self._declared.append(settings)
        await declare(self.connection, topology_of(settings))

    async def depth(self, queue: str) -> int:
        """Ready messages in ``queue`` (a passive declare)."""
        declared = await self.channel.declare_queue(queue, passive=True)
        count = declared.declaration_result.message_count
        return int(count or 0)

    async def return_times(self, queue: str, times: int) -> int:
        """Take the head of ``queue`` and hand it back ``times`` times, as a
        consumer dying with it in hand would; how many returns were made."""
        declared = await self.channel.declare_queue(queue, passive=True)
        for made in range(times):
            message = await declared.get(no_ack=False, fail=False, timeout=5)
            if message is None:
                return made
            await message.nack(requeue=True)
        return times

    async def consumers(self, queue: str) -> int:
        """Consumers attached to ``queue``; 0 while it does not exist yet."""
        channel = await self.connection.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
        except ChannelNotFoundEntity:
            return 0
        count = int(declared.declaration_result.consumer_count or 0)
        await channel.close()
        return count

    async def depths(self, settings: Settings) -> dict[str, int]:
        return {
            spec.name: await self.depth(spec.name) for spec in queue_specs(topology_of(settings))
        }

    async def dead_letters(self, settings: Settings) -> list[DeadLetter]:
        """Take every message out of ``Q.dlq``."""
        queue = await self.channel.declare_queue(
            Topology(settings.queue).dead_letter_queue, passive=True
        )
        letters = []
        while (message := await queue.get(fail=False, no_ack=True)) is not None:
            letters.append(
                DeadLetter(message.body, dict(message.headers), message.message_id,
                           message.content_type)
            )  # fmt: skip
        return letters

    async def delete_topology(self, settings: Settings) -> None:
        channel = await self.connection.channel()
        queues: dict[str, None] = {}
        exchanges: dict[str, None] = {}
        for each in (settings, *self._declared):
            names = Topology(each.queue)
            queues |= dict.fromkeys(spec.name for spec in queue_specs(topology_of(each)))
            exchanges |= dict.fromkeys(
                (each.exchange, names.retry_exchange, names.dead_letter_exchange)
            )
        for queue in queues:
            await channel.queue_delete(queue)
        for exchange in exchanges:
            await channel.exchange_delete(exchange)
        await channel.close()

    async def close(self) -> None:
        await self.connection.close()


class InProcessConsumer:
    """``semel consume`` run as a task of the test's event loop, through the container."""

    def __init__(self, settings: Settings, store: Store | None = None) -> None:
        self.container = Container()
        self.container.settings.override(providers.Object(settings))
        if store is not None:
            self.container.store.override(providers.Object(store))
        self.stop = asyncio.Event()
        self.task: asyncio.Task[int] | None = None

    async def start(self, broker: Broker, settings: Settings) -> InProcessConsumer:
        self.task = asyncio.create_task(run_consumer(self.container, self.stop))

        # Consuming has started once the work queue has a consumer.
        async def attached() -> bool:
            if self.task is not None and self.task.done():
                self.task.result()  # surface a start-up failure
            return await broker.consumers(settings.queue) > 0

        await eventually(attached, 20, "consumer attached")
        return self

    def settled(self, outcome: str, reason: str = "") -> int:
        """Deliveries settled so far as ``outcome`` (``semel_messages_total``)."""
        registry = self.container.metrics().registry
        labels = {"outcome": outcome, "reason": reason}
        return int(registry.get_sample_value("semel_messages_total", labels) or 0)

    async def until_settled(self, outcome: str, count: int, reason: str = "") -> None:
        """Wait until ``count`` deliveries have settled as ``outcome``: unlike a
        queue's depth, this also counts copies held where no depth shows them."""

        async def reached() -> bool:
            return self.settled(outcome, reason) >= count

        await eventually(reached, 20, f"{count} deliveries settled as {outcome} {reason}")

    async def finish(self, deadline: float = 30) -> int:
        """Ask it to stop (like SIGTERM) and return its exit code."""
        assert self.task is not None
        self.stop.set()
        return await asyncio.wait_for(self.task, deadline)


class ConsumerProcess:
    """``python -m semel`` as a real process."""

    def __init__(self, settings: Settings, log: Path, **env: str) -> None:
        self.env = settings_env(settings) | env
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ConsumerProcess:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "semel"],
                env=self.env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def exited(self) -> int | None:
        assert self.proc is not None
        return self.proc.poll()

    def signal(self, signum: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    async def wait(self, deadline: float = 30) -> int:
        end = time.monotonic() + deadline
        while (code := self.exited()) is None:
            if time.monotonic() > end:
                pytest.fail(f"consumer process still running after {deadline:g}s")
            await asyncio.sleep(0.05)
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextlib.contextmanager
def processes() -> Iterator[list[ConsumerProcess]]:
    """Consumer processes that are killed when the test ends, whatever happens."""
    started: list[ConsumerProcess] = []
    try:
        yield started
    finally:
        for process in started:
            process.kill()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

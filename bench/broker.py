"""The broker side of the benchmark: topology, fast publishing, and timing a drain.

Every case gets semel's own topology (declared with the same code and
settings the consumer uses, so its start-up declare is a no-op), the baseline
included: all consumers drain the same kind of quorum queue.

How a drain is timed, without touching the consumer under test:

* start: the queue's ready count (a passive declare, answered by the queue
  leader, so it is current) polled every few milliseconds; the drain starts
  between the last poll that saw every message and the first that did not;
* end: once nothing is ready, the last ACK is the last frame the consumers
  sent to the broker. The kernel keeps, per TCP socket, the time since the
  last send (``tcp_info.lastsnd``, read with ``ss``). When the consumers'
  AMQP sockets have been quiet for a moment, the broker is asked how many
  deliveries their channels still hold (``rabbitmqctl list_channels``,
  answered by the channel processes themselves; the queue's own unacked
  count in ``list_queues`` is refreshed only every few seconds for quorum
  queues). At zero, the drain ended when the sockets went quiet.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, cast

import aio_pika
import aiormq
import orjson
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.abc import ConfirmationFrameType
from aiormq.channel import Channel as RawChannel
from pamqp.commands import Basic

from bench.probes import SENT_HEADER
from semel.consumer.broker.topology import declare, queue_specs
from semel.consumer.names import Topology
from semel.consumer.plan import topology_of
from semel.settings import Settings

AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@localhost:5672/")
KEY_HEADER = "Idempotency-Key"
PUBLISH_WINDOW = 2000  # unconfirmed publishes in flight: the broker batches its confirms
POLL = 0.005  # seconds between ready-count polls while a drain starts
QUIET = 0.2  # seconds without a frame from the consumers before asking if they hold any
DRAIN_LIMIT = 900.0  # seconds a drain may take before the case is abandoned


class Consumers(Protocol):
    """The consumers of a case, as the drain timing watches them."""

    def alive(self) -> bool:
        """Whether every one still runs."""

    def quiet_for(self) -> float:
        """Seconds since any of them last sent a frame to the broker."""

    def unacked(self) -> int | None:
        """Deliveries they hold unacknowledged, as the broker counts them."""

    def cpu_seconds(self) -> float:
        """CPU time they have used so far, user and system."""


@dataclass(frozen=True, slots=True)
class Drain:
    """How long a drain took, and the consumers' CPU time meanwhile."""

    seconds: float
    cpu_seconds: float


class BenchError(Exception):
    """A case could not be measured (a consumer died, a drain stalled, messages left)."""


def body(index: int) -> bytes:
    """A small order event, about 200 bytes of JSON."""
    return orjson.dumps(
        {
            "order_id": f"B-{index:010d}",
            "amount": 4200 + index % 997,
            "currency": "EUR",
            "customer": {"id": f"C-{index % 50_000:06d}", "country": "FR", "tier": "standard"},
            "items": [{"sku": "SKU-000042", "qty": 2}, {"sku": "SKU-000777", "qty": 1}],
            "paid_at": "2024-05-01T12:00:00Z",
        }
    )


@dataclass(frozen=True, slots=True)
class Batch:
    """``count`` messages with keys ``<tag>-<i>``; publishing it twice sends duplicates."""

    tag: str
    count: int

    def messages(self) -> Iterator[tuple[str, bytes]]:
        for index in range(self.count):
            yield f"{self.tag}-{index}", body(index)


def properties(key: str, **headers: int) -> aiormq.spec.Basic.Properties:
    return aiormq.spec.Basic.Properties(
        content_type="application/json",
        delivery_mode=2,
        message_id=key,
        headers={KEY_HEADER: key, **headers},
    )


class Broker:
    """One connection for declaring, publishing and polling."""

    def __init__(
        self, connection: AbstractConnection, publishing: AbstractChannel, polling: AbstractChannel
    ) -> None:
        self._connection = connection
        self._publishing = publishing
        # Polls get a channel of their own: RabbitMQ 3.10 stopped delivering a
        # quorum queue to its consumers while the channel that had just
        # published thousands of messages kept passively declaring it.
        self._polling = polling

    @classmethod
    async def open(cls, url: str = AMQP_URL) -> Broker:
        connection = await aio_pika.connect(url)
        publishing = await connection.channel(publisher_confirms=True)
        return cls(connection, publishing, await connection.channel())

    async def close(self) -> None:
        await self._connection.close()

    async def declare(self, settings: Settings) -> None:
        await declare(self._connection, topology_of(settings))

    async def delete(self, settings: Settings) -> None:
        """Remove every queue and exchange of ``settings``' topology."""
        channel = await self._connection.channel()
        for spec in queue_specs(topology_of(settings)):
            await channel.queue_delete(spec.name)
        names = Topology(settings.queue)
        for exchange in (settings.exchange, names.retry_exchange, names.dead_letter_exchange):
            await channel.exchange_delete(exchange)
        await channel.close()

    async def _raw(self) -> RawChannel:
        # The concrete channel: its basic_publish can skip waiting for the socket.
        return cast(RawChannel, await self._publishing.get_underlay_channel())

    async def publish(self, exchange: str, batch: Batch) -> None:
        """Publish ``batch`` with confirms, ``PUBLISH_WINDOW`` of them in flight."""
        raw = await self._raw()
        window = asyncio.Semaphore(PUBLISH_WINDOW)
        pending: set[asyncio.Task[ConfirmationFrameType | None]] = set()
        refused: list[BaseException | ConfirmationFrameType | None] = []

        def confirmed(confirm: asyncio.Task[ConfirmationFrameType | None]) -> None:
            # A callback, not asyncio.wait over the window: that costs O(window) per message.
            pending.discard(confirm)
            window.release()
            error = confirm.exception()
            if error is not None or not isinstance(confirm.result(), Basic.Ack):
                refused.append(error or confirm.result())

        for key, payload in batch.messages():
            await window.acquire()
            if refused:
                break
            confirm = asyncio.create_task(
                raw.basic_publish(
                    payload,
                    exchange=exchange,
                    routing_key="bench",
                    properties=properties(key),
                    wait=False,  # no wait for the socket to drain: the writes pipeline
                )
            )
            pending.add(confirm)
            confirm.add_done_callback(confirmed)
        await asyncio.gather(*pending, return_exceptions=True)
        if refused:
            raise BenchError(f"the broker refused a publish: {refused[0]!r}")

    async def publish_paced(self, exchange: str, batch: Batch, rate: float) -> None:
        """Publish ``batch`` at ``rate`` messages/s, each stamped with its send time."""
        raw = await self._raw()
        pending: list[asyncio.Task[ConfirmationFrameType | None]] = []
        start = time.monotonic()
        for index, (key, payload) in enumerate(batch.messages()):
            delay = start + index / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            stamped = properties(key, **{SENT_HEADER: time.monotonic_ns()})
            publish = raw.basic_publish(
                payload, exchange=exchange, routing_key="bench", properties=stamped
            )
            pending.append(asyncio.create_task(publish))
        await asyncio.gather(*pending)

    async def ready(self, queue: str) -> int:
        raw = await self._polling.get_underlay_channel()
        declared = await raw.queue_declare(queue, passive=True)
        return int(declared.message_count or 0)

    async def leftovers(self, settings: Settings) -> dict[str, int]:
        """Messages still in any queue of the topology (all should be 0 after a case)."""
        counts = {
            spec.name: await self.ready(spec.name) for spec in queue_specs(topology_of(settings))
        }
        return {name: count for name, count in counts.items() if count}

    async def time_drain(
        self, queue: str, total: int, consumers: Consumers, *, strict: bool = True
    ) -> Drain:
        """Time from the first message leaving ``queue`` to the consumers' last ACK.

        ``strict``: the first poll must still see all ``total`` messages, or
        the start was missed.
        """
        deadline = time.monotonic() + DRAIN_LIMIT
        started: float | None = None
        cpu_at_start = 0.0
        before, first = time.monotonic(), True
        while True:
            ready = await self.ready(queue)
            now = time.monotonic()
            if started is None and ready < total:
                if strict and first:
                    raise BenchError(f"{queue}: the consumer started before the timing did")
                started = (before + now) / 2
                cpu_at_start = consumers.cpu_seconds()  # leaves out start-up
            if ready == 0:
                break
            _check_running(deadline, consumers, queue, ready)
            before, first = now, False
            await asyncio.sleep(POLL)
        assert started is not None
        while True:
            # A quiet socket may also be a consumer waiting on its store with
            # messages in hand: only the broker's unacked count says it is done.
            if consumers.quiet_for() >= QUIET and await asyncio.to_thread(consumers.unacked) == 0:
                seconds = max(time.monotonic() - consumers.quiet_for() - started, 1e-6)
                return Drain(seconds, consumers.cpu_seconds() - cpu_at_start)
            _check_running(deadline, consumers, queue, 0)
            await asyncio.sleep(QUIET / 4)


def _check_running(deadline: float, consumers: Consumers, queue: str, ready: int) -> None:
    if not consumers.alive():
        raise BenchError(f"a consumer of {queue} exited with {ready} messages ready")
    if time.monotonic() > deadline:
        raise BenchError(f"{queue} did not drain in {DRAIN_LIMIT:g}s ({ready} ready)")

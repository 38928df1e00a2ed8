"""``python -m bench.conflict_latency``: how long a parked conflict takes to be back in Q.

A consumer of a fresh work queue parks every message the first time it sees
it and records its return the second time: park → back in Q, against
``SEMEL_CONFLICT_DELAY``. Two ways of parking are measured on the same broker:

- ``semel``: today's hop, semel's own (:meth:`Settler.park`: a confirmed copy
  to ``Q.retry.conflict``, then the ACK; :class:`DelayReturns` holds it until
  due and publishes it back to Q, confirmed);
- ``broker``: the earlier hop, the broker's dead-lettering (a NACK without
  requeue into a conflict queue with a TTL that dead-letters back to Q),
  declared here from the earlier arguments.

Messages are published at ``--rate`` per second; the figures are the time
from the park to the second delivery, and its lateness over the delay.

    .venv/bin/python -m bench.conflict_latency --messages 1000 --rate 200 --delay 1
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection

from bench.broker import AMQP_URL
from semel.consumer.broker.delays import DelayReturns
from semel.consumer.broker.settle import Settler
from semel.consumer.broker.topology import TopologySpec, declare

PREFETCH = 256


@dataclass
class Hops:
    """When each message was parked, and how long it took to come back."""

    total: int
    parked: dict[str, float] = field(default_factory=dict)
    back: list[float] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def arrived(self, message_id: str) -> bool:
        """Whether this is the message's return (and record it); ``False``: park it."""
        start = self.parked.get(message_id)
        if start is None:
            self.parked[message_id] = time.monotonic()
            return False
        self.back.append(time.monotonic() - start)
        if len(self.back) == self.total:
            self.done.set()
        return True


async def declare_earlier(channel: AbstractChannel, spec: TopologySpec) -> None:
    names = spec.names
    quorum: dict[str, Any] = {"x-queue-type": "quorum"}
    at_least_once = {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
    retry = await channel.declare_exchange(names.retry_exchange, "direct", durable=True)
    conflict = await channel.declare_queue(
        names.conflict_queue,
        durable=True,
        arguments=quorum
        | at_least_once
        | {
            "x-message-ttl": int(spec.conflict_delay * 1000),
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": spec.queue,
        },
    )
    await conflict.bind(retry, "conflict")
    work_args = {"x-dead-letter-exchange": names.retry_exchange}
    work_args["x-dead-letter-routing-key"] = "conflict"
    await channel.declare_queue(
        spec.queue, durable=True, arguments=quorum | at_least_once | work_args
    )


async def measure(way: str, messages: int, rate: float, delay: float) -> list[float]:
    run = uuid.uuid4().hex[:8]
    spec = TopologySpec(queue=f"bench.hops.{run}", exchange=f"bench.hops.{run}.events",
                        retry_delays=(), conflict_delay=delay)  # fmt: skip
    connection: AbstractRobustConnection = await aio_pika.connect_robust(AMQP_URL)
    hops = Hops(messages)
    returns: DelayReturns | None = None
    try:
        publisher = await connection.channel(publisher_confirms=True, on_return_raises=True)
        if way == "semel":
            await declare(connection, spec)
            settler = await Settler.open(publisher, spec.names)
            returns = await DelayReturns.start(connection, spec)
        else:
            await declare_earlier(publisher, spec)
        consuming = await connection.channel()
        await consuming.set_qos(prefetch_count=PREFETCH)
        work = await consuming.get_queue(spec.queue)

        async def on_message(message: AbstractIncomingMessage) -> None:
            assert message.message_id is not None
            if hops.arrived(message.message_id):
                await message.ack()
            elif way == "semel":
                assert await settler.park(message)
                await message.ack()
            else:
                await message.nack(requeue=False)

        tag = await work.consume(on_message)
        for index in range(messages):
            body = aio_pika.Message(b"{}", message_id=str(index))
            await publisher.default_exchange.publish(body, routing_key=spec.queue)
            await asyncio.sleep(1 / rate)
        await asyncio.wait_for(hops.done.wait(), delay * 4 + messages / rate + 30)
        await work.cancel(tag)
        return hops.back
    finally:
        if returns is not None:
            await returns.stop()
        cleanup = await connection.channel()
        for queue in (spec.queue, spec.names.conflict_queue, spec.names.dead_letter_queue):
            await cleanup.queue_delete(queue)
        for exchange in (spec.exchange, spec.names.retry_exchange, spec.names.dead_letter_exchange):
            await cleanup.exchange_delete(exchange)
        await connection.close()


def percentile(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


async def main(args: argparse.Namespace) -> None:
    print(f"{args.messages} messages at {args.rate:g}/s, conflict delay {args.delay:g} s")
    print(f"{'hop':<8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}   lateness over the delay")
    for way in args.ways.split(","):
        back = await measure(way, args.messages, args.rate, args.delay)
        ms = [b * 1000 for b in back]
        late = [m - args.delay * 1000 for m in ms]
        print(
            f"{way:<8} {percentile(ms, 50):>8.1f} {percentile(ms, 99):>8.1f} {max(ms):>8.1f}"
            f"   p50 {percentile(late, 50):+.1f} ms, p99 {percentile(late, 99):+.1f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.conflict_latency", description=__doc__)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0, help="messages published per second")
    parser.add_argument("--delay", type=float, default=1.0, help="SEMEL_CONFLICT_DELAY, seconds")
    parser.add_argument("--ways", default="semel,broker", help="semel, broker or both")
    asyncio.run(main(parser.parse_args()))

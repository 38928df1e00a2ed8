"""Publish latency at a steady rate: from the client's COMMIT to the broker's confirm.

This process stages one message per transaction at ``rate`` messages/s on
one connection, like a web request that commits an order, and takes the time
(``CLOCK_MONOTONIC``) right after its ``COMMIT`` returns. A relay runs in a
child process (``bench.outbox.relay``), so only ``NOTIFY`` or its sweep can
wake it, never an event of the staging process. Two figures per message:

- commit → confirmed: the relay child writes when the broker's confirm
  reached it (the moment the message became the broker's responsibility;
  the row is marked sent after that, in the relay's next statement);
- commit → delivered: when a consumer of the target queue (in this process)
  got it. The broker delivers a quorum queue's message and confirms it once
  its log has it, so the two are close; neither bounds the other.

A few warm-up messages go first and are not counted: they prove the relay is
up (connected, listening) before the clock matters.

The same rate is then published directly with ``publish_confirmed``, one
message at a time from this process: publish → confirmed, what a request
that publishes without an outbox waits for.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aio_pika.abc import AbstractConnection, AbstractIncomingMessage
from psycopg import AsyncConnection

from bench.broker import BenchError
from bench.children import Child, semel_env
from bench.outbox.relay import CONFIRMS_ENV, PROFILE_ENV
from bench.outbox.scene import ROUTING_KEY, Scene, encoded, message, outgoing
from semel import Semel
from semel.consumer.broker.publishing import Published, publish_confirmed

WARM_UP = 3  # messages that must arrive before the measured ones are staged
START_LIMIT = 60.0  # seconds the relay gets to deliver the warm-up
SETTLE_LIMIT = 30.0  # seconds after the last commit for every message to arrive
PREFETCH = 256


@dataclass
class Arrivals:
    """When each message reached the consumer (monotonic ns), by message id."""

    at: dict[str, int] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_message(self, incoming: AbstractIncomingMessage) -> None:
        self.at.setdefault(incoming.message_id or "", time.monotonic_ns())
        await incoming.ack()
        self.changed.set()

    async def wait_for(self, ids: set[str], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not ids <= self.at.keys():
            left = deadline - time.monotonic()
            if left <= 0:
                missing = len(ids - self.at.keys())
                raise BenchError(f"{missing} staged messages never arrived in {seconds:g}s")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                continue


def percentiles(ns: list[int]) -> dict[str, float]:
    """p50, p95, p99 and max, in milliseconds."""
    ms = sorted(value / 1e6 for value in ns)
    cuts = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return {
        "count": len(ms),
        "p50_ms": cuts[49],
        "p95_ms": cuts[94],
        "p99_ms": cuts[98],
        "max_ms": ms[-1],
    }


async def _stage(engine: Semel, conn: AsyncConnection[Any], index: int) -> str:
    key, payload = message(index)
    async with conn.transaction():
        staged: str = await engine.outbox.stage(conn, payload, key=key, routing_key=ROUTING_KEY)
    return staged


async def _paced(engine: Semel, conn: AsyncConnection[Any], count: int, rate: float,
                 first: int) -> dict[str, int]:  # fmt: skip
    """Stage ``count`` messages at ``rate``; their commit times by message id."""
    committed: dict[str, int] = {}
    start = time.monotonic()
    for n in range(count):
        delay = start + n / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        message_id = await _stage(engine, conn, first + n)
        committed[message_id] = time.monotonic_ns()  # right after COMMIT returned
    return committed


def _confirms(path: Path) -> dict[str, int]:
    at: dict[str, int] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            message_id, _, ns = line.partition(" ")
            at.setdefault(message_id, int(ns))
    return at


async def measure_relay(scene: Scene, connection: AbstractConnection, *, listen: bool,
                        rate: float, seconds: float, logs: Path,
                        profile: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Commit → confirmed and commit → delivered with one relay, ``listen`` on or off;
    with ``profile`` (a folder), the relay runs under cProfile."""
    settings = scene.settings(listen=listen)
    engine = Semel(settings)
    name = f"relay-{'listen' if listen else 'sweep'}"
    confirms = logs / f"confirms-{name}.txt"
    confirms.unlink(missing_ok=True)
    env = semel_env(settings) | {CONFIRMS_ENV: str(confirms)}
    if profile is not None:
        env[PROFILE_ENV] = str(profile / f"latency-{name}.prof")
    relay = Child.start(name, [sys.executable, "-m", "bench.outbox.relay"], env, logs)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=PREFETCH)
    arrivals = Arrivals()
    queue = await channel.get_queue(scene.queue)
    tag = await queue.consume(arrivals.on_message)
    try:
        async with await AsyncConnection.connect(scene.postgres_dsn) as conn:
            warm = {await _stage(engine, conn, n) for n in range(WARM_UP)}
            await arrivals.wait_for(warm, START_LIMIT)
            cpu_before = relay.cpu_seconds()
            committed = await _paced(engine, conn, round(rate * seconds), rate, WARM_UP)
            await arrivals.wait_for(set(committed), SETTLE_LIMIT)
            cpu = relay.cpu_seconds() - cpu_before
    finally:
        await queue.cancel(tag)
        await channel.close()
        code = relay.stop()
    if code != 0:
        raise BenchError(f"{name} exited with {code}; its log: {relay.log}")
    relay.discard_log()
    confirmed = _confirms(confirms)
    confirms.unlink(missing_ok=True)
    result: dict[str, Any] = {
        "listen": listen,
        "rate": rate,
        "messages": len(committed),
        "commit_to_delivered": percentiles([arrivals.at[m] - at for m, at in committed.items()]),
        "relay_cpu_us_per_message": cpu / len(committed) * 1e6,
    }
    if not committed.keys() <= confirmed.keys():
        missing = len(committed.keys() - confirmed.keys())
        raise BenchError(f"{name}: no confirm recorded for {missing} messages (see confirms.py)")
    result["commit_to_confirmed"] = percentiles([confirmed[m] - at for m, at in committed.items()])
    return result


async def measure_direct(scene: Scene, connection: AbstractConnection, *, rate: float,
                         seconds: float) -> dict[str, Any]:  # fmt: skip
    """publish → confirmed with ``publish_confirmed``, one message at a time, at ``rate``."""
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.get_exchange(scene.exchange)
    waits: list[int] = []
    start = time.monotonic()
    try:
        for n in range(round(rate * seconds)):
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            body = encoded(n)
            began = time.monotonic_ns()
            answer = await publish_confirmed(exchange, outgoing(body), ROUTING_KEY)
            waits.append(time.monotonic_ns() - began)
            if answer is not Published.CONFIRMED:
                raise BenchError(f"the broker answered {answer} to a direct publish")
    finally:
        await channel.close()
    return {"rate": rate, "messages": len(waits), "publish_to_confirmed": percentiles(waits)}

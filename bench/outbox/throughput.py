"""Relay throughput: committed rows drained to the broker, against publishing them directly.

Rows are staged beforehand (``STAGE_BATCH`` per transaction, no relay
running), then relays start in child processes (``bench.outbox.relay``, one
or two) and drain the table. The drain is timed from the first batch a relay
committed as sent to the moment no row is left unsent, polling the table
(``EXISTS`` over the partial indexes, a few microseconds each) every
``POLL`` seconds; the rows sent before the first poll that saw any are left
out of the rate. Relays' start-up (connections, ``LISTEN``) is not timed.

The same rows are also drained by ``engine.relay()`` in this process, the
process the baseline runs in. The baseline publishes the same bodies with
``publish_confirmed`` from this process, each built into a message inside
the timed loop as the relay builds one per row (a uuid as its id and
``Idempotency-Key``), on a channel opened as the relay's (confirms, returns
raised), a relay batch at a time (``asyncio.gather`` of the batch, then the
next) as the relay publishes: the ratio is what the table costs, taking rows
and marking them sent, on top of the same confirmed publishes.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aio_pika.abc import AbstractConnection
from psycopg import AsyncConnection, sql

from bench.broker import BenchError
from bench.children import Child, Group, semel_env
from bench.outbox.relay import PROFILE_ENV
from bench.outbox.scene import ROUTING_KEY, Meter, Scene, encoded, message, outgoing
from semel import Semel
from semel.consumer.broker.publishing import Published, publish_confirmed

STAGE_BATCH = 500  # rows per staging transaction
POLL = 0.01  # seconds between polls of the table while relays drain it
DRAIN_LIMIT = 600.0

ANY_SENT = "SELECT EXISTS (SELECT 1 FROM {t} WHERE sent_at IS NOT NULL)"
ANY_UNSENT = "SELECT EXISTS (SELECT 1 FROM {t} WHERE sent_at IS NULL)"
SENT = "SELECT count(*) FROM {t} WHERE sent_at IS NOT NULL"


class Relays(Protocol):
    """The relays of a drain, as its timing watches them."""

    def alive(self) -> bool: ...

    def cpu_seconds(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Rate:
    """One drain or publish run: messages/s, and the CPU each process kind spent per message."""

    messages: int
    seconds: float
    cpu_us: dict[str, float]  # "client" (relays or this process), "postgres", "rabbitmq"
    machine_busy: float  # share of all cores busy during it

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "seconds": self.seconds,
            "messages_per_s": self.per_second,
            "cpu_us_per_message": self.cpu_us,
            "machine_busy": self.machine_busy,
        }


def _rate(messages: int, seconds: float, client_cpu: float, meter: Meter) -> Rate:
    spent = meter.spent()
    per = {"client": client_cpu, "postgres": spent["postgres"], "rabbitmq": spent["rabbitmq"]}
    cpu_us = {name: value / messages * 1e6 for name, value in per.items()}
    return Rate(messages, seconds, cpu_us, spent["machine_busy"])


async def publish_directly(scene: Scene, connection: AbstractConnection, count: int,
                           batch: int) -> Rate:  # fmt: skip
    """``count`` messages with ``publish_confirmed``, ``batch`` at once, from this process."""
    bodies = [encoded(n) for n in range(count)]  # the relay reads them ready-made too
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.get_exchange(scene.exchange)
    try:
        meter, cpu, began = Meter(), time.process_time(), time.monotonic()
        for start in range(0, count, batch):
            window = bodies[start : start + batch]
            answers = await asyncio.gather(
                *(publish_confirmed(exchange, outgoing(body), ROUTING_KEY) for body in window)
            )
            if any(answer is not Published.CONFIRMED for answer in answers):
                raise BenchError(f"the broker did not confirm a direct publish: {answers}")
        seconds = time.monotonic() - began
        return _rate(count, seconds, time.process_time() - cpu, meter)
    finally:
        await channel.close()


async def stage_rows(scene: Scene, count: int) -> float:
    """Stage ``count`` messages, ``STAGE_BATCH`` per transaction; returns stage calls/s."""
    engine = Semel(scene.settings())
    async with await AsyncConnection.connect(scene.postgres_dsn) as conn:
        began = time.monotonic()
        for start in range(0, count, STAGE_BATCH):
            async with conn.transaction():
                for n in range(start, min(start + STAGE_BATCH, count)):
                    key, payload = message(n)
                    await engine.outbox.stage(conn, payload, key=key, routing_key=ROUTING_KEY)
        rate = count / (time.monotonic() - began)
        await conn.set_autocommit(True)
        # Statistics as a long-lived table has them, not a fresh table's guesses.
        await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(scene.table)))
    return rate


def start_relays(scene: Scene, count: int, logs: Path, tag: str,
                 profile: Path | None) -> Group:  # fmt: skip
    env = semel_env(scene.settings())
    children = []
    for n in range(count):
        extra = {} if profile is None else {PROFILE_ENV: str(profile / f"{tag}-{n}.prof")}
        argv = [sys.executable, "-m", "bench.outbox.relay"]
        children.append(Child.start(f"{tag}-{n}", argv, env | extra, logs))
    return Group(children)


async def _exists(conn: AsyncConnection[Any], query: sql.Composed) -> bool:
    row = await (await conn.execute(query)).fetchone()
    return bool(row and row[0])


async def time_drain(scene: Scene, relays: Relays, total: int) -> Rate:
    """From the first rows marked sent to none left unsent; the relays' CPU meanwhile."""
    t = sql.Identifier(scene.table)
    any_sent, any_unsent = (sql.SQL(q).format(t=t) for q in (ANY_SENT, ANY_UNSENT))
    deadline = time.monotonic() + DRAIN_LIMIT
    async with await AsyncConnection.connect(scene.postgres_dsn, autocommit=True) as conn:
        while not await _exists(conn, any_sent):
            _check(relays, deadline)
            await asyncio.sleep(POLL)
        began, meter, cpu = time.monotonic(), Meter(), relays.cpu_seconds()
        row = await (await conn.execute(sql.SQL(SENT).format(t=t))).fetchone()
        already = int(row[0]) if row else 0
        before = time.monotonic()
        while await _exists(conn, any_unsent):
            _check(relays, deadline)
            before = time.monotonic()
            await asyncio.sleep(POLL)
        ended = (before + time.monotonic()) / 2
    if already >= total:
        raise BenchError(f"the drain of {total} rows was over before it could be timed")
    return _rate(total - already, ended - began, relays.cpu_seconds() - cpu, meter)


def _check(relays: Relays, deadline: float) -> None:
    if not relays.alive():
        raise BenchError("a relay exited during the drain")
    if time.monotonic() > deadline:
        raise BenchError(f"the relays did not drain the table in {DRAIN_LIMIT:g}s")


class Here:
    """The relay of :func:`drain_here`, watched like the children: this process's CPU
    (the polls of the drain's timing included: a few µs a message)."""

    def alive(self) -> bool:
        return True  # a failed pass is retried inside the relay; the deadline still holds

    def cpu_seconds(self) -> float:
        return time.process_time()


async def drain_here(scene: Scene, connection: AbstractConnection, total: int) -> Rate:
    """Time ``engine.relay()`` in this process draining ``total`` staged rows."""
    async with Semel(scene.settings()).relay():
        rate = await time_drain(scene, Here(), total)
    await _all_arrived(scene, connection, total, "relay in this process")
    return rate


async def drain(scene: Scene, connection: AbstractConnection, *, total: int, relays: int,
                logs: Path, tag: str, profile: Path | None = None) -> Rate:  # fmt: skip
    """Time ``relays`` relays draining ``total`` staged rows; every row must reach the queue."""
    group = start_relays(scene, relays, logs, tag, profile)
    try:
        rate = await time_drain(scene, group, total)
    finally:
        codes = group.stop()
    if any(codes):
        raise BenchError(f"{tag}: a relay exited with {codes}; logs in {logs}")
    for child in group.children:
        child.discard_log()
    await _all_arrived(scene, connection, total, tag)
    return rate


async def _all_arrived(scene: Scene, connection: AbstractConnection, total: int,
                       tag: str) -> None:  # fmt: skip
    channel = await connection.channel()
    try:
        arrived = await scene.ready(channel)
    finally:
        await channel.close()
    if arrived != total:
        raise BenchError(f"{tag}: {arrived} messages reached the queue for {total} rows")

"""Where the outbox benchmark runs: its own table, exchange and queue, and what it reads.

Every name carries the run's id, so a run never touches another's rows or
queues (nor the worker's defaults); :meth:`Scene.remove` drops them all.
The messages go to a direct exchange bound to one quorum queue (semel's
default queue type), where the latency phase's consumer takes them.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import aio_pika
import orjson
import psutil
from aio_pika.abc import AbstractChannel, AbstractConnection
from psycopg import AsyncConnection, sql

from bench.broker import AMQP_URL, body
from semel.consumer.names import IDEMPOTENCY_HEADER, JSON_CONTENT_TYPE
from semel.settings import Settings
from semel.stores.postgres.outbox import schema

POSTGRES_DSN = os.environ.get("BENCH_POSTGRES_DSN", "postgresql://localhost/test")
ROUTING_KEY = "bench"
# Server processes whose CPU time a measurement reports beside the clients'.
SERVERS = {"postgres": "postgres", "rabbitmq": "beam.smp"}


@dataclass(frozen=True, slots=True)
class Scene:
    """One run's table, exchange and queue."""

    run_id: str
    table: str
    exchange: str
    queue: str
    postgres_dsn: str = POSTGRES_DSN
    amqp_url: str = AMQP_URL

    @classmethod
    def fresh(cls) -> Scene:
        run_id = uuid.uuid4().hex[:8]
        names = f"bench.outbox.{run_id}"
        return cls(run_id, f"bench_outbox_{run_id}", names, names)

    def settings(self, *, listen: bool = True) -> Settings:
        """What the relays and the outbox writer of this run are given."""
        return Settings(
            store="postgres",
            postgres_dsn=self.postgres_dsn,
            amqp_url=self.amqp_url,
            outbox_table=self.table,
            outbox_listen=listen,
            exchange=self.exchange,
            queue=self.queue,
            key_prefix=f"bench{self.run_id}",
            metrics_port=0,
            log_format="json",
            log_level="warning",
        )

    async def create(self, channel: AbstractChannel) -> None:
        exchange = await channel.declare_exchange(self.exchange, "direct", durable=True)
        queue = await channel.declare_queue(
            self.queue, durable=True, arguments={"x-queue-type": "quorum"}
        )
        await queue.bind(exchange, ROUTING_KEY)
        async with await AsyncConnection.connect(self.postgres_dsn, autocommit=True) as conn:
            for statement in schema(self.table):
                await conn.execute(statement)

    async def remove(self, connection: AbstractConnection) -> None:
        channel = await connection.channel()
        await channel.queue_delete(self.queue)
        await channel.exchange_delete(self.exchange)
        await channel.close()
        async with await AsyncConnection.connect(self.postgres_dsn, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(self.table))
            )

    async def empty(self, channel: AbstractChannel) -> None:
        """Start a phase afresh: no rows, no messages."""
        await (await channel.get_queue(self.queue)).purge()
        async with await AsyncConnection.connect(self.postgres_dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(self.table)))

    async def ready(self, channel: AbstractChannel) -> int:
        declared = await channel.declare_queue(self.queue, passive=True)
        return int(declared.declaration_result.message_count or 0)


def message(index: int) -> tuple[str, dict[str, Any]]:
    """The ``index``-th message's key and body: the benchmark's usual 200-byte order."""
    return f"order-{index}", orjson.loads(body(index))


def _server_cpu() -> dict[tuple[str, int], float]:
    """User + system seconds of every server process so far, by (server, pid)."""
    seconds: dict[tuple[str, int], float] = {}
    for process in psutil.process_iter(["name", "cpu_times"]):
        for name, command in SERVERS.items():
            times = process.info["cpu_times"]
            if process.info["name"] == command and times is not None:
                seconds[(name, process.pid)] = times.user + times.system
    return seconds


def _machine_busy() -> float:
    times = psutil.cpu_times()
    return float(times.user + times.nice + times.system + times.irq + times.softirq)


class Meter:
    """CPU seconds of the servers and of the whole machine since it was made."""

    def __init__(self) -> None:
        self._began = time.monotonic()
        self._servers = _server_cpu()
        self._machine = _machine_busy()

    def spent(self) -> dict[str, float]:
        """Seconds of each server (PostgreSQL's backends opened meanwhile included),
        and ``machine_busy``: the share of all cores busy, whoever used them."""
        wall = time.monotonic() - self._began
        spent = dict.fromkeys(SERVERS, 0.0)
        for (name, pid), seconds in _server_cpu().items():
            spent[name] += seconds - self._servers.get((name, pid), 0.0)
        busy = _machine_busy() - self._machine
        spent["machine_busy"] = busy / (wall * (psutil.cpu_count() or 1))
        return spent


def encoded(index: int) -> bytes:
    """The ``index``-th message's body as the relay reads it from its row."""
    return orjson.dumps(message(index)[1])


def outgoing(body: bytes) -> aio_pika.Message:
    """A message as the relay builds it from a row: a fresh uuid as its id and key."""
    message_id = str(uuid.uuid4())
    return aio_pika.Message(
        body,
        headers={IDEMPOTENCY_HEADER: message_id},
        content_type=JSON_CONTENT_TYPE,
        message_id=message_id,
    )

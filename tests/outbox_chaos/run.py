"""One outbox chaos run: private servers, web processes, relays, a consumer, load, faults.

A private RabbitMQ node (:class:`tests.chaos.rabbit.RabbitNode`), a private
PostgreSQL cluster and a private Redis (:mod:`tests.chaos.servers`): the
shared services are never touched, so the restarts hurt no one else's test.
``web`` uvicorn processes of ``examples/fastapi_outbox.py`` (the first
``relays_in_web`` with a relay inside, through ``engine.relay()``) and
``relays`` ``semel relay`` processes share one outbox table; a downstream
``python -m semel`` worker (Redis store, the ledger handler of
:mod:`tests.outbox_chaos.ledger`) consumes the exchange, and a tap queue bound
to it for every routing key keeps a copy of everything the broker routed.

The faults are laid out over the expected flow (orders / rate): from 10 % of
it a SIGKILL every ``kill_every`` seconds, web process and relay in turn,
each restarted at once, until the driver is done; the broker restarted at
30 % (``stop_app``, ``broker_down`` s, ``start_app``); PostgreSQL stopped
with ``-m immediate`` (a crash: recovery on start) at 60 % for ``pg_down``
s; ``consumer_kills`` SIGKILLs of the consumer past its effect between 20 and
80 %. Then the run waits (up to ``drain_deadline``) until no outbox row is
unsent, every committed order is completed downstream and the consumer's
queues are empty, stops everything and judges (:mod:`tests.outbox_chaos.verdict`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import psycopg
from psycopg import sql

from semel.consumer.broker.topology import declare
from semel.consumer.plan import topology_of
from semel.settings import Settings
from semel.stores.base import Status
from tests.chaos.drain import statuses
from tests.chaos.ledger import LEDGER_ENV, read_runs
from tests.chaos.processes import private_dir, run
from tests.chaos.rabbit import RabbitNode
from tests.chaos.servers import PrivatePostgres, StoreServer, start_store
from tests.chaos.verdict import duplicates_of, read_settled
from tests.chaos.workers import Pool
from tests.conftest import open_store, settings_env
from tests.consumer.harness import Broker
from tests.outbox_chaos import ledger
from tests.outbox_chaos.driver import Driven, drive, plan
from tests.outbox_chaos.services import RELAY, WEB, Producers
from tests.outbox_chaos.verdict import Copy, OutboxRow, Verdict, judge
from tests.servers import wait_for_port

log = logging.getLogger("semel.outbox_chaos")


@dataclass(frozen=True, slots=True)
class OutboxChaosConfig:
    orders: int = 2000
    rate: float = 60.0  # orders per second
    fail: float = 0.1  # share of the orders sent with "fail": true
    repeat: float = 0.15  # share sent again by the client once answered
    web: int = 3
    relays: int = 2
    relays_in_web: int = 1  # web processes running a relay inside
    consumers: int = 1
    kill_every: float = 2.0  # seconds between two SIGKILLs of a web process or a relay
    consumer_kills: int = 2
    broker_down: float = 3.0
    pg_down: float = 3.0
    listen: bool = True  # SEMEL_OUTBOX_LISTEN
    seed: int = 1
    drain_deadline: float = 120.0
    keep: Path | None = None  # copy the ledger and every process's log here


@dataclass(slots=True)
class Report:
    config: OutboxChaosConfig
    verdict: Verdict
    driven: Driven
    web_kills: int = 0
    relay_kills: int = 0
    consumer_kills: int = 0
    exits: int = 0  # producing processes that ended by themselves, started again
    broker_restarts: int = 0
    pg_restarts: int = 0
    executions: int = 0
    effects: int = 0
    drained: bool = False
    wall: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.drained and self.verdict.ok and not self.driven.unanswered


def _settings(run_id: str, node: RabbitNode, pg: StoreServer, redis: StoreServer,
              config: OutboxChaosConfig) -> tuple[Settings, Settings]:  # fmt: skip
    """The producers' settings (PostgreSQL) and the consumer's (Redis)."""
    common: dict[str, Any] = {
        "amqp_url": node.url,
        "exchange": f"oc.{run_id}.events",
        "queue": f"oc.{run_id}.work",
        "key_prefix": run_id,
        "metrics_port": 0,
        "log_format": "json",
        "retention": 3600,  # sent rows stay until the verdict has read them
        "broker_give_up": 120,
    }
    producing: dict[str, Any] = {
        "postgres_table": f"oc_{run_id}_keys",
        "outbox_table": f"oc_{run_id}_outbox",
        "outbox_listen": config.listen,
        "log_level": "info",
    }
    consuming: dict[str, Any] = {
        "handler": "tests.outbox_chaos.ledger:handle",
        "lock_ttl": 2.5,
        "conflict_delay": 0.75,
        "retry_delays": [0.25, 0.75],
        "max_attempts": 3,
        "prefetch": 32,
        "shutdown_grace": 5,
        "log_level": "debug",  # the verdict reads every settled line
    }
    return (
        Settings(**(common | pg.settings() | producing)),
        Settings(**(common | redis.settings() | consuming)),
    )


async def run_outbox_chaos(config: OutboxChaosConfig, node: RabbitNode | None = None) -> Report:
    began = time.monotonic()
    rng = random.Random(config.seed)
    run_id = f"o{uuid.uuid4().hex[:8]}"
    async with contextlib.AsyncExitStack() as stack:
        if node is None:
            node = await RabbitNode.start()
            stack.callback(node.stop)
        restarts_before = node.restarts
        pg = await start_store("postgres")
        stack.push_async_callback(pg.stop)
        assert isinstance(pg, PrivatePostgres)
        redis = await start_store("redis")
        stack.push_async_callback(redis.stop)
        workdir = private_dir("semel-outbox-chaos-")
        stack.callback(shutil.rmtree, workdir, True)
        if config.keep is not None:
            stack.push_async_callback(_keep, workdir, config.keep / f"seed-{config.seed}")
        producing, consuming = _settings(run_id, node, pg, redis, config)
        orders_table = f"oc_{run_id}_orders"
        env = settings_env(producing) | {"ORDERS_TABLE": orders_table}
        await run([sys.executable, "-m", "semel", "migrate"], 60, env=env)
        store = await open_store(consuming)
        stack.push_async_callback(store.close)
        await store.migrate()
        tap = f"oc.{run_id}.tap"
        await _declare(consuming, tap)

        path = workdir / "ledger.db"
        pool = Pool(config.consumers, settings_env(consuming) | {LEDGER_ENV: str(path)},
                    workdir / "logs", path)  # fmt: skip
        stack.push_async_callback(pool.stop)
        logs = workdir / "logs"
        producers = Producers(config.web, config.relays, config.relays_in_web, env, logs)
        stack.push_async_callback(producers.stop)
        pool.start()
        await _start_producers(producers)
        await _wait_for_consumers(node.url, consuming.queue, config.consumers)

        orders = plan(config.orders, config.fail, config.repeat, run_id, rng)
        flow = config.orders / config.rate
        log.info("%d orders at %g/s over %d web processes, %d relays (+%d in web): about %.0fs",
                 config.orders, config.rate, config.web, config.relays, config.relays_in_web,
                 flow)  # fmt: skip
        supervisors = [asyncio.create_task(producers.supervise()),
                       asyncio.create_task(pool.supervise())]  # fmt: skip
        faults = Faults(config, flow, rng)
        driving = asyncio.ensure_future(drive(orders, producers.ports, config.rate, rng))
        try:
            await asyncio.gather(
                driving,
                faults.kills(producers, driving),
                faults.consumer_kills(pool),
                faults.broker(node),
                faults.postgres(pg),
            )
            driven = driving.result()
            log.info("driver done in %.1fs (%d requests); draining", driven.wall, driven.requests)
            # A connection of its own: one opened before the broker restart is gone.
            observer = await Broker.connect(node.url)
            stack.push_async_callback(observer.close)
            drained = await _drain(producing, consuming, store, observer, orders_table,
                                   config.drain_deadline)  # fmt: skip
        finally:
            driving.cancel()
            for task in supervisors:
                task.cancel()
            await producers.stop()
            await pool.stop()
        log.info("drained: %s; everything stopped", drained)
        report = await _judge(config, producing, consuming, store, orders_table, tap, orders,
                              driven, pool, producers)  # fmt: skip
        report.drained = drained
        report.broker_restarts = node.restarts - restarts_before
        report.pg_restarts = faults.pg_restarts
        report.wall = time.monotonic() - began
        return report
    raise AssertionError("unreachable")  # mypy: AsyncExitStack may swallow exceptions


class Faults:
    """The run's faults, each at its moment of the expected flow."""

    def __init__(self, config: OutboxChaosConfig, flow: float, rng: random.Random) -> None:
        self.config, self.flow, self.rng = config, flow, rng
        self.started = time.monotonic()
        self.pg_restarts = 0

    async def _at(self, share: float) -> None:
        await asyncio.sleep(max(0.0, self.started + share * self.flow - time.monotonic()))

    async def kills(self, producers: Producers, driving: asyncio.Future[Any]) -> None:
        """A web process and a relay in turn, every ``kill_every`` s, until the driver is done."""
        if self.config.kill_every <= 0:
            return
        await self._at(0.1)
        kinds = [kind for kind, count in ((WEB, self.config.web), (RELAY, self.config.relays))
                 if count]  # fmt: skip
        n = 0
        while kinds and not driving.done():
            kill = producers.kill_one(kinds[n % len(kinds)], self.rng)
            if kill is not None:
                log.info("kill %d: %s pid %d", n + 1, kill.kind, kill.pid)
            n += 1
            await asyncio.wait({driving}, timeout=self.config.kill_every)

    async def consumer_kills(self, pool: Pool) -> None:
        count = self.config.consumer_kills
        for n in range(count):
            await self._at(0.2 + 0.6 * n / max(1, count - 1))
            kill = await pool.kill_mid_handler(self.rng, after_effect=True, deadline=10)
            if kill is None:
                log.warning("consumer kill %d: no handler past its effect", n + 1)

    async def broker(self, node: RabbitNode) -> None:
        await self._at(0.3)
        log.info("broker: stop_app")
        await node.restart(self.config.broker_down)
        log.info("broker: started again")

    async def postgres(self, pg: PrivatePostgres) -> None:
        await self._at(0.6)
        log.info("postgres: stopped (-m immediate) for %gs", self.config.pg_down)
        await pg.outage(self.config.pg_down)
        self.pg_restarts += 1
        log.info("postgres: started again")


async def _declare(consuming: Settings, tap: str) -> None:
    connection = await aio_pika.connect(consuming.amqp_url)
    try:
        await declare(connection, topology_of(consuming))
        channel = await connection.channel()
        queue = await channel.declare_queue(tap, durable=True)
        await queue.bind(consuming.exchange, "#")
    finally:
        await connection.close()


async def _start_producers(producers: Producers) -> None:
    """The first web process alone (its start-up creates the orders table), then the rest."""
    first, *others = producers.web
    first.start()
    await asyncio.to_thread(wait_for_port, producers.ports[0], 60)
    for slot in [*others, *producers.relays]:
        slot.start()
    for port in producers.ports[1:]:
        await asyncio.to_thread(wait_for_port, port, 60)


async def _wait_for_consumers(url: str, queue: str, count: int) -> None:
    observer = await Broker.connect(url)
    try:
        end = time.monotonic() + 60
        while await observer.consumers(queue) < count:
            if time.monotonic() > end:
                raise RuntimeError(f"{count} consumers not on {queue} after 60s")
            await asyncio.sleep(0.2)
    finally:
        await observer.close()


async def _rows(dsn: str, query: str, *tables: str) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        statement = sql.SQL(query).format(*(sql.Identifier(t) for t in tables))
        cursor = await conn.execute(statement)
        return await cursor.fetchall()


async def _drain(producing: Settings, consuming: Settings, store: Any, observer: Broker,
                 orders_table: str, deadline: float) -> bool:  # fmt: skip
    """Until nothing is unsent, every committed order is completed downstream, queues empty."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        with contextlib.suppress(psycopg.Error):
            [(unsent,)] = await _rows(producing.postgres_dsn,
                                      "SELECT count(*) FROM {} WHERE sent_at IS NULL",
                                      producing.outbox_table)  # fmt: skip
            keys = [key for (key,) in await _rows(producing.postgres_dsn, "SELECT key FROM {}",
                                                  orders_table)]  # fmt: skip
            found = await statuses(store, keys)
            done = all(status is Status.COMPLETED for status in found.values())
            depths = await observer.depths(consuming)
            if unsent == 0 and done and not any(depths.values()):
                return True
        await asyncio.sleep(0.5)
    return False


async def _tap(url: str, queue: str) -> list[Copy]:
    """Every copy in the tap queue, with the key the consumer reads (the header)."""
    copies = []
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        while (message := await declared.get(no_ack=True, fail=False)) is not None:
            key = str(message.headers.get("Idempotency-Key", ""))
            copies.append(Copy(key, message.message_id or ""))
        await declared.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()
    return copies


async def _judge(config: OutboxChaosConfig, producing: Settings, consuming: Settings, store: Any,
                 orders_table: str, tap: str, orders: list[Any],
                 driven: Driven, pool: Pool, producers: Producers) -> Report:  # fmt: skip
    dsn = producing.postgres_dsn
    committed = {str(key): str(mid) for key, mid in
                 await _rows(dsn, "SELECT key, message_id FROM {}", orders_table)}  # fmt: skip
    rows = await _rows(dsn, "SELECT key, message_id, sent_at IS NOT NULL FROM {}",
                       producing.outbox_table)  # fmt: skip
    outbox = [OutboxRow(str(key), str(mid), bool(sent)) for key, mid, sent in rows]
    copies = await _tap(consuming.amqp_url, tap)
    runs = read_runs(pool.ledger)
    settled = read_settled(pool.log_files)
    duplicates = duplicates_of(runs, settled, pool.kills, [])
    found = await statuses(store, committed)
    completed = {key for key, status in found.items() if status is Status.COMPLETED}
    failing = {order.key for order in orders if order.fail}
    verdict = judge(committed, failing, outbox, copies, ledger.message_ids(pool.ledger),
                    driven.answers, completed, duplicates)  # fmt: skip
    return Report(
        config=config,
        verdict=verdict,
        driven=driven,
        web_kills=producers.count(WEB),
        relay_kills=producers.count(RELAY),
        consumer_kills=len(pool.kills),
        exits=producers.exits,
        executions=len(runs),
        effects=sum(1 for r in runs if r.effect is not None),
    )


async def _keep(workdir: Path, target: Path) -> None:
    await asyncio.to_thread(shutil.copytree, workdir, target, dirs_exist_ok=True)

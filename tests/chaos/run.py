"""One chaos run against one store: servers, workers, traffic, faults, drain, verdict.

The timeline is laid out over the expected publishing time ``flow``. In a
``classic`` run worker kills spread over 10-85 % of it (or land every
``kill_every`` seconds from 10 % of it until the producer is done), the
broker restart lands at 30 %, the store outage at 60 % once handlers run
again, so every fault lands while messages flow. A run of one of the other
kinds (:mod:`tests.chaos.faults`) injects only that fault: a Redis filling up
or one worker's blackholed link at ``fault_at`` of the flow, once handlers
run, or a slow link for the whole run. After the producer is done the run
waits (up to the drain deadline) until every key is completed in the store or
dead-lettered and the work, retry and conflict queues are empty.

``front`` picks what the workers are: ``python -m semel`` with the ledger
handler, or a FastStream app with semel's middleware whose subscriber is that
handler (:mod:`tests.chaos.faststream_app`). Everything else, the verdict
included, is the same for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika

from semel.consumer.broker.topology import declare
from semel.consumer.plan import topology_of
from semel.settings import Settings
from semel.settings.model import TRANSACTIONAL_CONNECTIONS
from semel.stores.base import Status, Store
from tests.chaos.drain import Drain, statuses
from tests.chaos.faults import (
    BLACKHOLE,
    CLASSIC,
    FULL,
    ROLLING,
    SLOW,
    SLOW_BURST,
    STALLED_SLOT,
    fits,
    proxy_to,
)
from tests.chaos.ledger import LEDGER_ENV, read_runs
from tests.chaos.processes import private_dir
from tests.chaos.producer import Order, Publisher, Sent, plan, produce
from tests.chaos.rabbit import RabbitNode
from tests.chaos.servers import PrivateRedisTopology, StoreServer, start_store
from tests.chaos.timeline import Timeline
from tests.chaos.transactional import (
    TRANSACTIONAL,
    committed_effects,
    create_effects_table,
    mode_settings,
    server_kind,
)
from tests.chaos.verdict import (
    Failover,
    Verdict,
    claim_lost,
    duplicates_of,
    held_through,
    judge,
    overlapping,
    read_settled,
)
from tests.chaos.workers import FASTSTREAM, WORKER, Pool
from tests.conftest import open_store, settings_env
from tests.consumer.harness import Broker
from tests.proxy import TcpProxy
from tests.servers import aws_test_credentials

log = logging.getLogger("semel.chaos")


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    store: str
    fault: str = CLASSIC  # which faults: see tests.chaos.faults
    messages: int = 3000
    workers: int = 2
    kills: int = 12
    kill_every: float = 0.0  # > 0: a SIGKILL every that many seconds, instead of ``kills``
    seed: int = 1
    rate: float = 100.0  # messages per second, copies included
    duplicates: float = 0.4  # share of the messages that are copies
    prefetch: int = 32
    broker_down: float = 3.0  # seconds between stop_app and start_app
    outage: float = 6.0  # seconds the store is away; longer than the lease on purpose
    outage_when_running: int = 8  # handlers in flight when the store goes away
    fault_at: float = 0.25  # share of the flow before a full store or a blackhole
    stall: float = 6.0  # seconds a blackholed link holds everything; more than two leases
    slow_delay: float = 0.05  # seconds a slow link holds each chunk, each way
    slow_prefetch: int = 256
    terms: int = 6  # rolling: SIGTERMs mid-handler, each worker started again after
    rolling_grace: float = 0.05  # rolling: SEMEL_SHUTDOWN_GRACE, shorter than most handlers
    lock_ttl: float = 2.5
    conflict_delay: float = 0.75
    retry_delays: tuple[float, ...] = (0.25, 0.75)
    drain_deadline: float = 180.0
    keep: Path | None = None  # copy the ledger and worker logs here
    # Replicated Redis stores: replicas that acknowledge each write (SEMEL_REDIS_REPLICAS_ACK).
    replicas_ack: int = 0
    front: str = WORKER  # what each worker process runs: see tests.chaos.workers.FRONTS


@dataclass(slots=True)
class Report:
    """Everything the table shows for one store."""

    store: str
    sent: Sent
    verdict: Verdict
    fault: str = CLASSIC
    fault_detail: str = ""  # what a fault other than classic did
    kills: int = 0
    kills_after_effect: int = 0
    restarts: int = 0
    terms: int = 0  # rolling restarts: SIGTERMs mid-handler
    exits: int = 0  # restarts of workers that exited by themselves
    broker_restarts: int = 0
    outages: int = 0
    outage_kind: str = ""
    executions: int = 0
    effects: int = 0
    attempted: int = 0  # effects begun; in transactional mode some were rolled back
    held: int = 0  # deliveries whose completion waited for the store to come back
    overlaps: int = 0  # pairs of executions of one key that ran at the same time
    overlaps_claim_lost: int = 0  # of them, after a claim the failed primary had not replicated
    replicas_ack: int = 0
    front: str = WORKER
    failovers: list[Failover] = field(default_factory=list)
    # Wall-clock span of the handler executions: the faults landed inside it, or not.
    flow: tuple[float, float] = (0.0, 0.0)
    slowest: float = 0.0  # seconds from a delivery's arrival to its settle, at most
    dlq_messages: int = 0
    left_in_queues: int = 0
    drained: bool = False
    wall: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.drained and self.verdict.ok

    @property
    def label(self) -> str:
        """The store, and the replica acknowledgements asked for, if any."""
        return f"{self.store}, WAIT {self.replicas_ack}" if self.replicas_ack else self.store


def chaos_settings(
    config: ChaosConfig, node: RabbitNode, server: StoreServer, run: str, port: int | None = None
) -> Settings:
    """The run's settings; ``port``: reach the store there (a proxy) rather than directly."""
    prefetch = config.slow_prefetch if config.fault == SLOW else config.prefetch
    rolling = config.fault == ROLLING
    if config.store == TRANSACTIONAL:  # a handler per connection: no more in flight
        prefetch = min(prefetch, TRANSACTIONAL_CONNECTIONS)
    overrides: dict[str, Any] = {
        "amqp_url": node.url,
        "queue": f"chaos.{run}.work",
        "exchange": f"chaos.{run}.events",
        "key_prefix": run,
        "handler": f"tests.chaos.ledger:{'handle_sync' if rolling else 'handle'}",
        "lock_ttl": config.lock_ttl,
        "conflict_delay": config.conflict_delay,
        "retry_delays": list(config.retry_delays),
        "max_attempts": 3,
        "retention": 3600,
        "max_claims": 10,
        "handler_timeout": 30,
        "shutdown_grace": config.rolling_grace if rolling else 5,
        "broker_give_up": 120,
        "prefetch": prefetch,
        "metrics_port": 0,
        "log_format": "json",
        "log_level": "debug",  # the verdict reads every settled line
    }
    return Settings(**(overrides | server.settings(port) | mode_settings(config.store)))


def done_checker(store: Store) -> Callable[[str], Awaitable[bool]]:
    async def is_done(key: str) -> bool:
        found = await statuses(store, [key])
        return found[key] in (Status.COMPLETED, Status.FAILED)

    return is_done


async def wait_for_consumers(observer: Broker, queue: str, count: int, deadline: float) -> None:
    end = time.monotonic() + deadline
    while await observer.consumers(queue) < count:
        if time.monotonic() > end:
            raise RuntimeError(f"{count} workers not consuming {queue} after {deadline:g}s")
        await asyncio.sleep(0.2)


def front_fits(front: str, store: str, fault: str) -> bool:
    """Whether workers of ``front`` can run ``fault`` against ``store``: the FastStream
    subscriber is the async ledger handler, so neither the transactional handler
    (its effect written through ``context.db``) nor the rolling run's plain ``def``."""
    return front != FASTSTREAM or (store != TRANSACTIONAL and fault != ROLLING)


async def run_chaos(config: ChaosConfig, node: RabbitNode | None = None) -> Report:
    """Run one store's chaos; ``node`` is a private broker to reuse (started if absent)."""
    if not front_fits(config.front, config.store, config.fault):
        wanted = f"{config.store} {config.fault}"
        raise ValueError(f"the {config.front} front door does not run {wanted}")
    began = time.monotonic()
    aws_test_credentials()
    rng = random.Random(config.seed)
    run = f"c{uuid.uuid4().hex[:8]}"
    async with contextlib.AsyncExitStack() as stack:
        if node is None:
            node = await RabbitNode.start()
            stack.callback(node.stop)
        restarts_before = node.restarts
        server = await start_store(server_kind(config.store), config.replicas_ack)
        stack.push_async_callback(server.stop)
        workdir = private_dir("semel-chaos-run-")
        stack.callback(shutil.rmtree, workdir, True)
        settings = chaos_settings(config, node, server, run)  # direct, for the run itself
        workers, own_env, stalled = await _links(config, settings, node, server, stack)
        store = await open_store(settings)
        stack.push_async_callback(store.close)
        await store.migrate()
        if config.store == TRANSACTIONAL:
            await create_effects_table(settings.postgres_dsn)
        connection = await aio_pika.connect(node.url)
        await declare(connection, topology_of(settings))
        await connection.close()

        ledger = workdir / "ledger.db"
        env = settings_env(workers) | {LEDGER_ENV: str(ledger), "PYTHONUNBUFFERED": "1"}
        pool = Pool(config.workers, env, workdir / "logs", ledger, own_env, config.front)
        stack.push_async_callback(pool.stop)
        if config.keep is not None:
            name = (
                f"{config.store}-wait{config.replicas_ack}" if config.replicas_ack else config.store
            )
            stack.push_async_callback(_keep, workdir, config.keep / name, server.logs())
        pool.start()
        observer = await Broker.connect(node.url)
        await wait_for_consumers(observer, settings.queue, config.workers, 60)
        await observer.close()

        orders = plan(config.messages, config.duplicates, run, rng)
        # A slow store meets a burst: the workers' prefetch windows fill up.
        rate = config.rate * (SLOW_BURST if config.fault == SLOW else 1)
        flow = sum(1 + order.copies for order in orders) / rate
        timeline = Timeline(config, flow, rng)
        log.info("%s, %s: %d %s workers consuming; publishing for about %.0fs", config.store,
                 config.fault, config.workers, config.front, flow)  # fmt: skip
        supervisor = asyncio.create_task(pool.supervise())
        publisher = Publisher(node.url, settings.exchange)
        stack.push_async_callback(publisher.close)
        gates = timeline.rolling_gates() if config.fault == ROLLING else []
        # Started before the faults, which may run for as long as it does.
        flowing = produce(
            publisher, orders, rate, done_checker(store), rng, [gate for gate, _ in gates]
        )
        producing = asyncio.ensure_future(flowing)
        try:
            faults: list[Awaitable[None]] = []
            if config.fault == CLASSIC:
                faults += [
                    timeline.kills(pool, producing),
                    timeline.broker_and_store(node, server, pool),
                ]
            elif config.fault == FULL:
                faults.append(timeline.fill_up(server, pool))
            elif config.fault == ROLLING:
                faults.append(timeline.rolling(pool, gates))
                timeline.detail = (
                    f"plain def handlers; {config.terms} SIGTERMs mid-handler "
                    f"(grace {config.rolling_grace:g}s), {config.kills} SIGKILLs"
                )
            elif config.fault == BLACKHOLE:
                assert stalled is not None
                faults.append(timeline.blackhole(stalled, pool))
            else:
                timeline.detail = (
                    f"every worker's link {config.slow_delay * 1000:g} ms each way per chunk, "
                    f"prefetch {config.slow_prefetch}, lease {config.lock_ttl:g}s, "
                    f"published at {rate:g}/s"
                )
            await asyncio.gather(producing, *faults)
            sent = producing.result()
            log.info("producer done (%d confirmed); draining", sent.total)
            observer = await Broker.connect(node.url)
            stack.push_async_callback(observer.close)
            drain = Drain(observer, store, settings, [order.key for order in orders])
            drained = await drain.until_settled(config.drain_deadline)
        finally:
            producing.cancel()  # a no-op once it is done
            await pool.stop()
            supervisor.cancel()
        log.info("drained: %s; workers stopped", drained)
        await drain.final()
        left = await drain.busy()
        report = await _report(config, settings, orders, sent, pool, drain, timeline, server)
        report.broker_restarts = node.restarts - restarts_before
        report.drained, report.left_in_queues = drained, left
        report.wall = time.monotonic() - began
        return report
    raise AssertionError("unreachable")  # mypy: AsyncExitStack may swallow exceptions


async def _links(
    config: ChaosConfig,
    direct: Settings,
    node: RabbitNode,
    server: StoreServer,
    stack: contextlib.AsyncExitStack,
) -> tuple[Settings, dict[int, dict[str, str]], TcpProxy | None]:
    """How the workers reach the store: their settings, one slot's own, the link to stall."""
    run = direct.key_prefix
    if config.fault in (CLASSIC, ROLLING):
        return direct, {}, None
    if not fits(config.fault, config.store) or server.client_port is None:
        raise ValueError(f"the {config.fault} fault does not fit the {config.store} store")
    if config.fault == SLOW:
        slow = await proxy_to(server.client_port, stack, config.slow_delay)
        return chaos_settings(config, node, server, run, slow.port), {}, None
    if config.fault == BLACKHOLE:
        if config.stall <= 2 * config.lock_ttl:
            raise ValueError(f"a stall of {config.stall:g}s is not longer than two leases")
        stalled = await proxy_to(server.client_port, stack)
        own = chaos_settings(config, node, server, run, stalled.port).as_env()
        return direct, {STALLED_SLOT: own}, stalled
    return direct, {}, None


async def _report(
    config: ChaosConfig,
    settings: Settings,
    orders: list[Order],
    sent: Sent,
    pool: Pool,
    drain: Drain,
    timeline: Timeline,
    server: StoreServer,
) -> Report:
    runs = read_runs(pool.ledger)
    attempted = sum(1 for r in runs if r.effect is not None)
    transactional = config.store == TRANSACTIONAL
    if transactional:
        runs = await committed_effects(settings.postgres_dsn, runs)
    settled = read_settled(pool.log_files)
    windows = timeline.windows(pool)
    failovers = server.failovers if isinstance(server, PrivateRedisTopology) else []
    duplicates = duplicates_of(runs, settled, pool.kills, windows, failovers)
    failing = {o.key for o in orders if o.body.get("fail") in ("always", "permanent")}
    verdict = judge([o.key for o in orders], drain.completed, drain.dead, duplicates, failing)
    verdict.strict = transactional
    verdict.replicated = config.replicas_ack >= 1
    overlaps = overlapping(runs)
    return Report(
        store=config.store,
        sent=sent,
        verdict=verdict,
        fault=config.fault,
        fault_detail=timeline.detail,
        kills=len(pool.kills),
        kills_after_effect=sum(1 for k in pool.kills if k.after_effect),
        restarts=pool.restarts,
        terms=len(pool.terms),
        exits=len(pool.exits),
        outages=len(timeline.outages),
        outage_kind=server.outage_kind,
        executions=len(runs),
        effects=sum(1 for r in runs if r.effect is not None),
        attempted=attempted,
        held=held_through(settled, windows),
        overlaps=len(overlaps),
        overlaps_claim_lost=sum(1 for pair in overlaps if claim_lost(pair, failovers)),
        replicas_ack=config.replicas_ack,
        front=config.front,
        failovers=list(failovers),
        flow=(
            min((r.started for r in runs), default=0.0),
            max((r.started for r in runs), default=0.0),
        ),
        slowest=max((s.duration for s in settled), default=0.0),
        dlq_messages=drain.dlq_messages,
    )


async def _keep(workdir: Path, target: Path, server_logs: list[Path]) -> None:
    await asyncio.to_thread(shutil.copytree, workdir, target, dirs_exist_ok=True)
    for log in server_logs:  # one directory per server: name them after it
        if log.exists():
            kept = target / "store-logs" / f"{log.parent.name}-{log.name}"
            kept.parent.mkdir(exist_ok=True)
            await asyncio.to_thread(shutil.copyfile, log, kept)

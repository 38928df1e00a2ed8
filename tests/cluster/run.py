"""One cluster run: workers over the nodes, traffic with duplicates, one node fault, the verdict.

The chaos run's parts do the work: its ledger handler records every
execution outside the store, its producer publishes distinct keys with
concurrent and late copies, its pool runs and watches the worker processes,
its drain waits until every key is completed or dead-lettered, and its
verdict counts lost keys and duplicate effects, each with a cause. What is
new is the broker: the cluster of :mod:`tests.rabbit_cluster`, reached by
every worker through the one setting that names all three nodes.

The work queue is declared through node 1, so its leader is there (the
leader of a new quorum queue is the declaring client's node); the run checks
that its three members are the three nodes. Before a message is sent, worker
0 is on node 1 and another worker on another node (see
:mod:`tests.cluster.placement`); for a partition, worker 0 runs inside node
1's namespace and worker 1 outside it, connected to node 1 too.

The store is a private Redis with an fsync-always append-only file, listening
on loopback and on the bridge, where a worker inside a namespace reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika

from semel.consumer.broker.topology import declare
from semel.consumer.delivery.decide import Outcome
from semel.consumer.plan import topology_of
from semel.settings import QueueType, Settings
from tests.chaos.drain import Drain
from tests.chaos.ledger import LEDGER_ENV, read_runs
from tests.chaos.processes import private_dir
from tests.chaos.producer import Publisher, Sent, plan, produce
from tests.chaos.run import done_checker, wait_for_consumers
from tests.chaos.servers import PrivateRedis
from tests.chaos.verdict import Verdict, Window, duplicates_of, judge, overlapping, read_settled
from tests.chaos.workers import Pool
from tests.cluster.faults import (
    LEADER_KILL,
    PARTITION,
    ROLLING,
    FaultRecord,
    leader_kill,
    partition,
    rolling,
)
from tests.cluster.placement import BesideNode, Endpoint, failovers, place
from tests.cluster.storm import STORM, conflict_plan, held_for_dead_lettering, kill_workers, storm
from tests.conftest import open_store, settings_env
from tests.consumer.harness import Broker
from tests.rabbit_cluster import ClusterNode, RabbitCluster
from tests.servers import free_port

log = logging.getLogger("semel.cluster")


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    fault: str
    messages: int = 2000
    duplicates: float = 0.4  # share of the messages that are copies
    # Messages per second, copies included; None: 100, 25 for a rolling
    # restart, whose three restarts take 45 to 50 s (the nodes run the
    # management plugin) and must all meet traffic,
    # and 70 for the storm, whose two kills and restarts must too.
    rate: float | None = None
    seed: int = 1
    queue_type: QueueType = QueueType.QUORUM
    prefetch: int = 32
    lock_ttl: float = 2.5
    conflict_delay: float = 0.75
    retry_delays: tuple[float, ...] = (0.25, 0.75)
    # Seconds a killed or stopped node stays down; None: 5, 8 in the storm.
    node_down: float | None = None
    worker_kills_every: float = 2.0  # the storm's SIGKILLs of workers
    fault_at: float | None = None  # share of the flow before the fault; None: 0.25 (0.08 rolling)
    drain_deadline: float = 120.0
    keep: Path | None = None  # copy the ledger and worker logs here

    @property
    def workers(self) -> int:
        return 3 if self.fault in (PARTITION, STORM) else 2

    @property
    def pace(self) -> float:
        if self.rate is not None:
            return self.rate
        return {ROLLING: 25.0, STORM: 70.0}.get(self.fault, 100.0)

    @property
    def down(self) -> float:
        if self.node_down is not None:
            return self.node_down
        return 8.0 if self.fault == STORM else 5.0

    @property
    def start_at(self) -> float:
        if self.fault_at is not None:
            return self.fault_at
        # The storm times its two kills itself, from the start of the flow.
        return {ROLLING: 0.08, STORM: 0.0}.get(self.fault, 0.25)


@dataclass(slots=True)
class ClusterReport:
    fault: str
    sent: Sent
    verdict: Verdict
    record: FaultRecord
    queue_type: QueueType = QueueType.QUORUM
    worker_kills: int = 0
    conflicts: int = 0  # deliveries that met their key in progress and were parked
    # messages_dlx of each queue the moment the queues looked drained (the storm only)
    held: dict[str, int] | None = None
    placed: dict[int, str] = field(default_factory=dict)  # slot -> node before the fault
    placement_restarts: int = 0
    failovers: dict[int, float | None] = field(default_factory=dict)
    exits: int = 0  # workers that ended by themselves (must stay 0)
    executions: int = 0
    effects: int = 0
    overlaps: int = 0
    dlq_messages: int = 0
    left_in_queues: int = 0
    drained: bool = False
    wall: float = 0.0

    @property
    def ok(self) -> bool:
        nothing_held = self.held is None or not any(self.held.values())
        return (
            self.drained
            and self.verdict.ok
            and self.exits == 0
            and self.overlaps == 0
            and nothing_held
        )

    @property
    def label(self) -> str:
        return f"{self.fault} ({self.queue_type})" if self.fault == STORM else self.fault


class ClusterPublisher(Publisher):
    """The chaos producer's publisher, reconnecting to the next node each time it must."""

    def __init__(self, urls: list[str], exchange: str) -> None:
        super().__init__(urls[0], exchange)
        self._urls = urls
        self._turn = 0

    async def _open(self) -> aio_pika.abc.AbstractExchange:
        if self._exchange is None:  # a new connection is due: to the next node
            self.url = self._urls[self._turn % len(self._urls)]
            self._turn += 1
        return await super()._open()


class BridgedRedis(PrivateRedis):
    """The chaos run's Redis, also listening on the bridge for workers inside a namespace."""

    def __init__(self, home: Path, bridge: str) -> None:
        super().__init__(home)
        argv = self.child.argv
        argv[argv.index("--bind") + 1 : argv.index("--bind") + 2] = ["127.0.0.1", bridge]
        # Protected mode refuses every client but loopback's when there is no password.
        argv += ["--protected-mode", "no"]

    def url(self, host: str = "127.0.0.1") -> str:
        return f"redis://{host}:{self.port}/0"


def cluster_settings(
    config: ClusterConfig, cluster: RabbitCluster, redis: str, run: str
) -> Settings:
    overrides: dict[str, Any] = {
        "amqp_url": cluster.url,
        "store": "redis",
        "redis_url": redis,
        "queue": f"cluster.{run}.work",
        "exchange": f"cluster.{run}.events",
        "key_prefix": run,
        "handler": "tests.chaos.ledger:handle",
        "lock_ttl": config.lock_ttl,
        "conflict_delay": config.conflict_delay,
        "retry_delays": list(config.retry_delays),
        "max_attempts": 3,
        "retention": 3600,
        "handler_timeout": 30,
        "shutdown_grace": 5,
        "broker_give_up": 120,
        "prefetch": config.prefetch,
        "queue_type": config.queue_type,
        "metrics_port": 0,
        "log_format": "json",
        "log_level": "debug",  # the verdict reads every settled line
    }
    return Settings(**overrides)


async def _declare_on(node: ClusterNode, settings: Settings, cluster: RabbitCluster) -> None:
    """Declare the topology through ``node``, which then holds the work queue's leader."""
    connection = await aio_pika.connect(node.url)
    try:
        await declare(connection, topology_of(settings))
    finally:
        await connection.close()
    if settings.queue_type is QueueType.CLASSIC:
        return  # a classic queue lives on the node it was declared through
    leader = await cluster.leader(settings.queue)
    if leader is not node:
        raise RuntimeError(f"{settings.queue}'s leader is on {leader}, not {node.name}")


async def run_cluster(config: ClusterConfig, cluster: RabbitCluster) -> ClusterReport:
    """One run on ``cluster``, which is whole again when it returns."""
    began = time.monotonic()
    rng = random.Random(config.seed)
    run = f"k{uuid.uuid4().hex[:8]}"
    first, second, _third = cluster.nodes
    await cluster.restore()  # whole, whatever an earlier run left
    async with contextlib.AsyncExitStack() as stack:
        workdir = private_dir("semel-cluster-run-")
        stack.callback(shutil.rmtree, workdir, True)
        redis = BridgedRedis(private_dir("semel-cluster-redis-"), cluster.gateway)
        await asyncio.to_thread(redis.child.start)
        stack.push_async_callback(redis.stop)
        settings = cluster_settings(config, cluster, redis.url(), run)
        store = await open_store(settings)
        stack.push_async_callback(store.close)
        await store.migrate()
        await _declare_on(first, settings, cluster)

        ledger = workdir / "ledger.db"
        ports = {slot: free_port() for slot in range(config.workers)}
        own = {slot: {"SEMEL_METRICS_PORT": str(port)} for slot, port in ports.items()}
        endpoints = {slot: Endpoint("127.0.0.1", port) for slot, port in ports.items()}
        if config.fault == PARTITION:  # worker 0 beside node 1, on its side of the cut
            own[0]["SEMEL_REDIS_URL"] = redis.url(cluster.gateway)
            endpoints[0] = Endpoint(first.ip, ports[0])
        env = settings_env(settings) | {LEDGER_ENV: str(ledger), "PYTHONUNBUFFERED": "1"}
        pool = Pool(config.workers, env, workdir / "logs", ledger, own)
        if config.fault == PARTITION:
            pool.workers[0] = BesideNode(pool.workers[0], cluster.exec_argv(first))
        stack.push_async_callback(pool.stop)
        if config.keep is not None:
            stack.push_async_callback(_keep, workdir, config.keep / config.fault)
        pool.start()
        wanted = _wanted(config, cluster)
        placed, restarts = await place(pool, endpoints, wanted)
        observer = await Broker.connect(second.url)
        await wait_for_consumers(observer, settings.queue, config.workers, 60)
        await observer.close()  # the fault may take its node: a fresh one drains

        making = conflict_plan if config.fault == STORM else plan
        orders = making(config.messages, config.duplicates, run, rng)
        flow = sum(1 + order.copies for order in orders) / config.pace
        log.info("%s: %d workers on %s; publishing for about %.0fs", config.fault,
                 config.workers, placed, flow)  # fmt: skip
        supervisor = asyncio.create_task(pool.supervise())
        publisher = ClusterPublisher([node.url for node in cluster.nodes], settings.exchange)
        stack.push_async_callback(publisher.close)
        record = FaultRecord()
        traffic_over = asyncio.Event()
        held = None
        try:
            producing = asyncio.ensure_future(
                produce(publisher, orders, config.pace, done_checker(store), rng)
            )
            producing.add_done_callback(lambda _: traffic_over.set())
            producing.add_done_callback(lambda _: setattr(record, "traffic_ended", time.time()))
            fault = _fault(config, cluster, settings, endpoints, placed, record, flow)
            kills = (
                kill_workers(pool, rng, config.worker_kills_every, traffic_over, flow)
                if config.fault == STORM
                else asyncio.sleep(0)
            )
            await asyncio.gather(producing, fault, kills)
            sent = producing.result()
            log.info("producer done (%d confirmed); draining", sent.total)
            observer = await Broker.connect(second.url)
            stack.push_async_callback(observer.close)
            drain = Drain(observer, store, settings, [order.key for order in orders])
            drained = await drain.until_settled(config.drain_deadline)
            if config.fault == STORM:  # at once: what looks drained must hold nothing back
                held = await held_for_dead_lettering(second, settings)
            found_failovers = await failovers(endpoints)
        finally:
            supervisor.cancel()
            await pool.stop()
        await drain.final()
        report = _report(config, orders, sent, pool, drain, record)
        report.placed, report.placement_restarts = placed, restarts
        report.queue_type, report.held = config.queue_type, held
        report.failovers = found_failovers
        report.drained, report.left_in_queues = drained, await drain.busy()
        report.wall = time.monotonic() - began
        return report
    raise AssertionError("unreachable")  # mypy: AsyncExitStack may swallow exceptions


def _wanted(config: ClusterConfig, cluster: RabbitCluster) -> dict[int, frozenset[str]]:
    """Which nodes each worker must be on before the fault."""
    first = cluster.nodes[0].address
    others = frozenset(node.address for node in cluster.nodes[1:])
    if config.fault == PARTITION:
        # 0 beside node 1 and on it; 1 outside, on it too; 2 on the other side.
        return {0: frozenset({first}), 1: frozenset({first}), 2: others}
    if config.fault == STORM:  # 2 anywhere: its SIGKILLs soon spread them all anyway
        return {0: frozenset({first}), 1: others, 2: others | {first}}
    return {0: frozenset({first}), 1: others}


async def _fault(
    config: ClusterConfig,
    cluster: RabbitCluster,
    settings: Settings,
    endpoints: dict[int, Endpoint],
    placed: dict[int, str],
    record: FaultRecord,
    flow: float,
) -> None:
    await asyncio.sleep(config.start_at * flow)
    try:
        await _inject(config, cluster, settings, endpoints, placed, record, flow)
    except Exception as exc:  # what the fault saw before it failed is the evidence
        raise RuntimeError(f"{config.fault}: {exc}\nuntil then: {record.detail}") from exc


async def _inject(
    config: ClusterConfig,
    cluster: RabbitCluster,
    settings: Settings,
    endpoints: dict[int, Endpoint],
    placed: dict[int, str],
    record: FaultRecord,
    flow: float,
) -> None:
    first = cluster.nodes[0]
    on_first = {slot: endpoints[slot] for slot, node in placed.items() if node == first.address}
    if config.fault == LEADER_KILL:
        await leader_kill(cluster, settings.queue, first, on_first, config.down, record)
    elif config.fault == ROLLING:
        await rolling(cluster, first, config.down, record)
    elif config.fault == PARTITION:
        remote = {slot: e for slot, e in on_first.items() if slot != 0}
        await partition(cluster, settings.queue, first, remote, record)
    elif config.fault == STORM:
        await storm(cluster, settings, first, flow, config.down, record)
    else:
        raise ValueError(f"unknown fault {config.fault!r}")


def _report(
    config: ClusterConfig,
    orders: list[Any],
    sent: Sent,
    pool: Pool,
    drain: Drain,
    record: FaultRecord,
) -> ClusterReport:
    runs = read_runs(pool.ledger)
    settled = read_settled(pool.log_files)
    # Only in a partition is a worker cut off from the store: worker 0, beside the node.
    windows = []
    if config.fault == PARTITION:
        windows.append(Window(record.began, record.ended, pool.pids_of(0)))
    duplicates = duplicates_of(runs, settled, pool.kills, windows)
    failing = {o.key for o in orders if o.body.get("fail") in ("always", "permanent")}
    verdict = judge([o.key for o in orders], drain.completed, drain.dead, duplicates, failing)
    return ClusterReport(
        fault=config.fault,
        sent=sent,
        verdict=verdict,
        record=record,
        exits=len(pool.exits),  # the run's own SIGKILLs are not exits
        worker_kills=len(pool.kills),
        conflicts=sum(1 for event in settled if event.outcome == Outcome.IN_PROGRESS),
        executions=len(runs),
        effects=sum(1 for r in runs if r.effect is not None),
        overlaps=len(overlapping(runs)),
        dlq_messages=drain.dlq_messages,
    )


async def _keep(workdir: Path, target: Path) -> None:
    await asyncio.to_thread(shutil.copytree, workdir, target, dirs_exist_ok=True)

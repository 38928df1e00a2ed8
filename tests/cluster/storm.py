"""The storm: the work queue's node killed twice under a burst of conflicts, workers killed too.

What broke semel when the broker moved its messages by dead-lettering: many
in-progress conflicts parked at once while the node leading the work queue
dies, comes back, and dies again (leader elections close together), and
workers SIGKILLed every couple of seconds meanwhile, so hops are cut short at
every step. semel now makes every hop itself, with confirms; this run is its
proof, on quorum queues and on classic ones.

- The stream is conflict-heavy: most copies are concurrent, in bursts of
  several per key published back to back, so they race each other through
  the workers and most of them meet the key in progress and are parked.
- The node that leads the work queue (for a classic queue: the node it lives
  on, node 1) is SIGKILLed at a fifth of the flow and again at a half, each
  time started again ``down`` seconds later.
- A worker running a handler is SIGKILLed every ``every`` seconds while the
  originals flow (after its handler's effect or before it, at random), and
  started again at once. Not after: late copies wait for the last keys to
  complete, and kills aimed at whatever still runs would then hit the same
  key every time, which semel rightly dead-letters as poison.

When the queues look drained, the run asks the management API what the
broker holds for dead-lettering (``messages_dlx``) in every queue of semel's:
it must be nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

from semel.consumer.broker.management import QueueState, queue_states
from semel.consumer.broker.topology import queue_specs
from semel.consumer.plan import topology_of
from semel.settings import QueueType, Settings
from tests.chaos.producer import Order, order_body
from tests.chaos.workers import Pool
from tests.cluster.faults import FaultRecord, new_leader
from tests.rabbit_cluster import ClusterNode, RabbitCluster

STORM = "storm"
KILLS_AT = (0.2, 0.5)  # shares of the flow at which the work queue's node is killed
BURST = (2, 6)  # concurrent copies of one key published together
CONCURRENT_SHARE = 0.8  # of the copies; the rest are late copies


def conflict_plan(messages: int, duplicates: float, run: str, rng: random.Random) -> list[Order]:
    """``messages`` in all, a ``duplicates`` share of them copies, most in concurrent bursts."""
    distinct = max(1, round(messages * (1 - duplicates)))
    extra = messages - distinct
    concurrent = round(extra * CONCURRENT_SHARE)
    copies = [0] * distinct
    late = [0] * distinct
    left = concurrent
    while left > 0:
        burst = min(left, rng.randint(*BURST))
        copies[rng.randrange(distinct)] += burst
        left -= burst
    for index in rng.choices(range(distinct), k=extra - concurrent):
        late[index] += 1
    return [Order(f"{run}-{n}", order_body(n, rng), copies[n], late[n]) for n in range(distinct)]


async def kill_workers(
    pool: Pool, rng: random.Random, every: float, traffic_over: asyncio.Event, flow: float
) -> None:
    """SIGKILL a worker with a handler running every ``every`` seconds for ``flow`` seconds
    (the originals' time), or until the traffic ends."""
    end = time.monotonic() + flow
    while not traffic_over.is_set() and time.monotonic() < end:
        began = time.monotonic()
        await pool.kill_mid_handler(rng, after_effect=rng.random() < 0.5, deadline=every)
        pause = max(0.0, began + every - time.monotonic())
        with contextlib.suppress(TimeoutError):  # the schedule's pause, cut short at the end
            await asyncio.wait_for(traffic_over.wait(), pause)


async def node_of_the_queue(
    cluster: RabbitCluster, settings: Settings, home: ClusterNode
) -> ClusterNode:
    """The node a kill must take to hurt the work queue: its leader's, or its home."""
    if settings.queue_type is QueueType.CLASSIC:
        return home  # declared through it, and a classic queue never moves
    leader = await cluster.leader(settings.queue)
    if leader is None:
        raise RuntimeError(f"{settings.queue} has no leader")
    return leader


async def storm(
    cluster: RabbitCluster,
    settings: Settings,
    home: ClusterNode,
    flow: float,
    down: float,
    record: FaultRecord,
) -> None:
    """Kill the work queue's node at each share of ``flow`` in KILLS_AT; start it again."""
    record.began = began = time.time()
    for share in KILLS_AT:
        # Asked before the kill is due: each rabbitmqctl call boots a VM, seconds on a busy host.
        target = await node_of_the_queue(cluster, settings, home)
        await asyncio.sleep(max(0.0, began + share * flow - time.time()))
        killed_at = time.time()
        await cluster.kill(target)
        record.note(f"{target.name} SIGKILLed")
        if settings.queue_type is QueueType.QUORUM:
            elected = await new_leader(cluster, settings.queue, target)
            record.note(f"leader of {settings.queue} on {elected.name}")
        await asyncio.sleep(max(0.0, killed_at + down - time.time()))
        await cluster.start_node(target)
        await cluster.await_running(120, note=record.note)
        record.note(f"{target.name} started again, cluster whole")
    record.ended = time.time()


async def held_for_dead_lettering(node: ClusterNode, settings: Settings) -> dict[str, int]:
    """Every queue of semel's with what the broker holds of it for dead-lettering."""
    names = [spec.name for spec in queue_specs(topology_of(settings))]
    states: list[QueueState] = await asyncio.to_thread(queue_states, node.management_url, names)
    return {state.name: state.held_for_dead_lettering for state in states}

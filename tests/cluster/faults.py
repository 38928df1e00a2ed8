"""The node faults of a cluster run, each as an operator or an outage would cause it.

- ``leader-kill``: the node holding the work queue's leader is SIGKILLed,
  stays down ``down`` seconds, and is started again (it rejoins by itself).
- ``rolling``: each node in turn, the leader's first, as a rolling upgrade
  does it: wait until every quorum queue could lose a member
  (``rabbitmq-upgrade await_online_quorum_plus_one``), ``rabbitmqctl
  stop_app``, ``down`` seconds, ``start_app``, wait until the cluster is
  whole again.
- ``partition``: the leader's node link goes down. Its peers and every
  client outside its namespace stop hearing from it, with no reset; a worker
  inside its namespace loses the other nodes and the store. The link stays
  down until the node has paused itself (``pause_minority``, after the net
  tick), the queue has a leader on the other side, and a worker connected to
  the node from outside has given it up (missed heartbeats) and moved; then
  it comes up again and the node rejoins.

Each records what it saw, with times from the fault's start, for the report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tests.chaos.processes import run
from tests.cluster.placement import Endpoint, until_moved
from tests.rabbit_cluster import NET_TICKTIME, ClusterNode, RabbitCluster

LEADER_KILL = "leader-kill"
ROLLING = "rolling"
PARTITION = "partition"
FAULTS = (LEADER_KILL, ROLLING, PARTITION)

WHOLE_DEADLINE = 120.0  # seconds a node may take to be back in the cluster
# A consumer gives a silent node up after three missed heartbeats (10 s each
# by default), checked every half heartbeat: about 35 s, and slack.
SILENT_NODE_DEADLINE = 60.0

log = logging.getLogger("semel.cluster")


@dataclass(slots=True)
class FaultRecord:
    """What a fault did and saw: events as (seconds since its start, what)."""

    began: float = 0.0  # wall clock
    ended: float = 0.0
    traffic_ended: float = 0.0  # when the producer had sent its last copy
    events: list[tuple[float, str]] = field(default_factory=list)
    moved_after: dict[int, float | None] = field(default_factory=dict)  # slot -> seconds

    def during_traffic(self, what: str) -> bool:
        """Whether every event naming ``what`` came before the traffic ended."""
        times = [self.began + at for at, event in self.events if what in event]
        return bool(times) and all(t < self.traffic_ended for t in times)

    def note(self, what: str) -> None:
        at = time.time() - self.began
        self.events.append((at, what))
        log.info("%6.1fs  %s", at, what)

    @property
    def detail(self) -> str:
        return "; ".join(f"{what} at {at:.1f}s" for at, what in self.events)


def _note_moves(record: FaultRecord, what: str) -> None:
    for slot, after in record.moved_after.items():
        record.note(f"worker {slot} {what} after {after:.1f}s" if after else f"worker {slot} stuck")


async def wait_for(check: Callable[[], Awaitable[bool]], deadline: float, what: str) -> None:
    end = time.monotonic() + deadline
    while not await check():
        if time.monotonic() > end:
            raise RuntimeError(f"{what}: not within {deadline:g}s")
        await asyncio.sleep(0.25)


async def new_leader(cluster: RabbitCluster, queue: str, old: ClusterNode) -> ClusterNode:
    found: list[ClusterNode] = []

    async def elected() -> bool:
        leader = await cluster.leader(queue)
        if leader is not None and leader is not old:
            found.append(leader)
            return True
        return False

    await wait_for(elected, WHOLE_DEADLINE, f"a leader of {queue} elsewhere than {old.name}")
    return found[-1]


async def leader_kill(
    cluster: RabbitCluster,
    queue: str,
    leader: ClusterNode,
    on_it: dict[int, Endpoint],
    down: float,
    record: FaultRecord,
) -> None:
    """SIGKILL the leader's node; ``on_it``: workers connected to it, whose moves are timed."""
    record.began = time.time()
    await cluster.kill(leader)
    record.note(f"{leader.name} SIGKILLed")
    moves = asyncio.gather(*(until_moved(e, leader.address, down + 30) for e in on_it.values()))
    elected = await new_leader(cluster, queue, leader)
    record.note(f"leader of {queue} on {elected.name}")
    record.moved_after = dict(zip(on_it, await moves, strict=True))
    _note_moves(record, "moved off it")
    await asyncio.sleep(max(0.0, record.began + down - time.time()))
    await cluster.start_node(leader)
    await cluster.await_running(WHOLE_DEADLINE, note=record.note)
    record.ended = time.time()
    record.note(f"{leader.name} started again, cluster whole")


async def rolling(
    cluster: RabbitCluster, first: ClusterNode, down: float, record: FaultRecord
) -> None:
    """Restart every node in turn, ``first`` first, each stopped gracefully."""
    record.began = time.time()
    order = [first, *(node for node in cluster.nodes if node is not first)]
    for node in order:
        upgrade = node.argv("rabbitmq-upgrade", "-l", "-n", node.name,
                            "await_online_quorum_plus_one", "-t", "60")  # fmt: skip
        await run(upgrade, 90)
        await cluster.stop_app(node)
        record.note(f"{node.name} stop_app")
        await asyncio.sleep(down)
        await cluster.start_app(node)
        await cluster.await_running(WHOLE_DEADLINE, note=record.note)
        record.note(f"{node.name} start_app, cluster whole")
    record.ended = time.time()


async def partition(
    cluster: RabbitCluster,
    queue: str,
    node: ClusterNode,
    remote: dict[int, Endpoint],
    record: FaultRecord,
) -> None:
    """Cut ``node`` off; ``remote``: workers outside its namespace connected to it."""
    record.began = time.time()
    cluster.partition(node)
    record.note(f"{node.name}'s link down")
    moves = asyncio.gather(
        *(until_moved(e, node.address, SILENT_NODE_DEADLINE) for e in remote.values())
    )

    async def paused() -> bool:
        return not await cluster.app_running(node)  # asked inside its namespace

    await wait_for(paused, 3 * NET_TICKTIME, f"{node.name} pausing (pause_minority)")
    record.note(f"{node.name} paused itself (minority)")
    elected = await new_leader(cluster, queue, node)
    record.note(f"leader of {queue} on {elected.name}")
    record.moved_after = dict(zip(remote, await moves, strict=True))
    _note_moves(record, "gave the node up")
    cluster.heal(node)
    record.ended = time.time()
    record.note(f"{node.name}'s link up")
    await cluster.await_running(WHOLE_DEADLINE, note=record.note)
    record.note("cluster whole")

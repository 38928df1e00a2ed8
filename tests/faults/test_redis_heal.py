"""A node the tests kill comes back empty; healing it must never let a failover
promote it before it holds its successor's data, or acknowledged writes vanish."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from redis.crc import key_slot
from redis.exceptions import RedisError

from tests.redis_process import Server
from tests.redis_servers import Cluster, SentinelSet

pytestmark = pytest.mark.timeout(120)

KEYS = 500
STALL = 3.0  # seconds: past the sentinels' 1 s down-after


async def test_a_stall_while_the_healed_node_syncs_never_promotes_it_empty(
    redis_sentinel: SentinelSet,
) -> None:
    with redis_sentinel.primary().client() as client:
        client.mset({f"heal:{i}": i for i in range(KEYS)})
        assert client.execute_command("WAIT", 1, 5000) == 1  # a replica has every key
    victim = await asyncio.to_thread(redis_sentinel.kill_primary)
    await _heal_during_a_stall(redis_sentinel, victim, redis_sentinel.primary())
    serving = redis_sentinel.primary()
    with serving.client() as client:
        assert client.exists(*(f"heal:{i}" for i in range(KEYS))) == KEYS, serving.port


async def test_a_stall_while_the_healed_node_syncs_never_fails_over_to_it_empty(
    redis_cluster: Cluster,
) -> None:
    keys = [f"{{heal}}:{i}" for i in range(KEYS)]  # one slot, so one primary
    slot = key_slot(b"heal")
    owner = next(n for n in redis_cluster.primaries() if slot in n.slots)
    with redis_cluster.server(owner.port).client() as client:
        client.mset(dict.fromkeys(keys, 1))
        assert client.execute_command("WAIT", 1, 5000) == 1
    victim = await asyncio.to_thread(redis_cluster.kill_primary, owner.port)
    successor = next(n for n in redis_cluster.primaries() if slot in n.slots)
    await _heal_during_a_stall(redis_cluster, victim, redis_cluster.server(successor.port))
    serving = next(n for n in redis_cluster.primaries() if slot in n.slots)
    with redis_cluster.server(serving.port).client() as client:
        assert client.exists(*keys) == KEYS, serving.port


async def _heal_during_a_stall(
    topology: Cluster | SentinelSet, victim: Server, successor: Server
) -> None:
    """Heal ``victim``; the moment it is back (empty, syncing), stall ``successor``."""
    healing = asyncio.create_task(asyncio.to_thread(topology.heal, victim))
    await _restarted(victim)
    await stall(successor)
    await asyncio.wait_for(healing, 60)


async def _restarted(victim: Server) -> None:
    end = time.monotonic() + 10
    while not (victim.alive and _answers(victim)):
        assert time.monotonic() < end, "the killed node not back"
        await asyncio.sleep(0.02)


def _answers(server: Server) -> bool:
    try:
        return server.info("replication").get("role") == "slave"
    except (RedisError, OSError):  # still starting
        return False


async def stall(server: Server) -> None:
    """The server gets no CPU for a while, as under a loaded machine."""
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(STALL)  # the fault's length, not a wait for an event
    finally:
        server.process.send_signal(signal.SIGCONT)

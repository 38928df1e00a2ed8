"""Redis Cluster promises the shared contract cannot see: a batch's round trips per node,
the key layout, slots on the move, and a cluster reached by the wrong URL."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable

import pytest
from redis import Redis
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterCrossSlotError, MovedError, TryAgainError

from semel.settings import Settings
from semel.stores.base import ClaimRequest, Completion, Outcome, Status, Store
from semel.stores.errors import StoreMisconfigured, StoreUnavailable
from semel.stores.redis.buckets import stored_key
from semel.stores.redis.errors import store_error
from semel.stores.redis.setup import FEW_REPLICAS, NO_PERSISTENCE
from semel.stores.redis.slots import NOT_A_CLUSTER
from tests.conftest import SettingsFactory, StoreFactory, open_store, settings_env
from tests.redis_process import HOST
from tests.redis_servers import Cluster, ClusterNode
from tests.stores.leftovers import store_tasks
from tests.stores.race import decided

pytestmark = pytest.mark.timeout(90)

FP = "f" * 64


@pytest.fixture
def backend() -> str:
    return "redis-cluster"


def _owners(cluster: Cluster) -> dict[int, ClusterNode]:
    """Every slot's primary."""
    return {slot: node for node in cluster.primaries() for slot in node.slots}


def _commandstats(cluster: Cluster, node: ClusterNode) -> Counter[str]:
    with cluster.server(node.port).client() as client:
        stats = client.info("commandstats")
    return Counter({name: int(s["calls"]) for name, s in stats.items() if isinstance(s, dict)})


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Writes to each server (by port) on every connection of this process: round trips."""
    sent: Counter[int] = Counter()
    # The write under every other: the store calls it directly, the client through
    # send_packed_command.
    original = AbstractConnection._send_packed_command

    async def counted(self: AbstractConnection, command: Iterable[bytes]) -> None:
        sent[int(self.port)] += 1  # type: ignore[attr-defined]
        await original(self, command)

    monkeypatch.setattr(AbstractConnection, "_send_packed_command", counted)
    return sent


async def test_a_batch_costs_one_round_trip_per_node(
    make_store: StoreFactory, redis_cluster: Cluster, round_trips: Counter[int]
) -> None:
    store = await make_store()
    warm = decided(await store.claim_many([ClaimRequest(f"w{i}", FP) for i in range(300)]))
    # Every node has its connection open and both scripts cached now.
    assert await store.complete_many([Completion(c.record.key, c.fence, b"1") for c in warm])
    owners = _owners(redis_cluster)
    keys = [f"rt{i}" for i in range(300)]
    slots = {key_slot(_stored(store, k)) for k in keys}
    nodes = {owners[slot].port: owners[slot] for slot in slots}
    assert len(nodes) == 3
    before = {port: _commandstats(redis_cluster, node) for port, node in nodes.items()}
    round_trips.clear()

    claims = decided(await store.claim_many([ClaimRequest(k, FP) for k in keys]))
    assert {c.outcome for c in claims} == {Outcome.CLAIMED}
    assert round_trips == dict.fromkeys(nodes, 1)
    round_trips.clear()
    done = [Completion(c.record.key, c.fence, store.encode_result(i)) for i, c in enumerate(claims)]
    assert await store.complete_many(done) == [True] * len(keys)
    assert round_trips == dict.fromkeys(nodes, 1)

    # On each node: one call per slot of the batch's keys there, nothing sent again.
    for port, node in nodes.items():
        calls = _commandstats(redis_cluster, node) - before[port]
        mine = sum(1 for slot in slots if owners[slot].port == port)
        assert calls["cmdstat_evalsha"] == 2 * mine, (port, calls)
        assert calls["cmdstat_eval"] == 0


def _stored(store: Store, key: str) -> bytes:
    return stored_key(store.config.namespaced("").encode(), key)


async def test_keys_are_kept_under_their_bucket_tag(
    make_store: StoreFactory, redis_cluster: Cluster
) -> None:
    store = await make_store(retention=60.0, lock_ttl=5.0)
    claim = await store.claim("k", FP)
    assert await store.complete("k", claim.fence, [1])
    key = _stored(store, "k")
    assert key.startswith(f"{store.config.key_prefix}:{{".encode())
    assert key.endswith(b"}:k")
    owner = _owners(redis_cluster)[key_slot(key)]
    with redis_cluster.server(owner.port).client() as client:
        assert client.type(key) == b"hash"
        assert 55_000 < client.pttl(key) <= 60_000


def _asking(client: Redis, *command: str | bytes) -> object:
    """``command`` on a node importing its key's slot, which needs ASKING before it."""
    with client.pipeline(transaction=False) as pipe:
        pipe.execute_command("ASKING")  # type: ignore[no-untyped-call]
        pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        return pipe.execute()[1]


async def test_a_slot_on_the_move_is_followed_and_a_split_key_set_waits(
    make_store: StoreFactory, redis_cluster: Cluster
) -> None:
    store = await make_store()
    # Two keys of one bucket, so of one slot.
    old = "old"
    slot = key_slot(_stored(store, old))
    new = next(k for k in (f"new{i}" for i in range(1000)) if key_slot(_stored(store, k)) == slot)
    source = _owners(redis_cluster)[slot]
    target = next(n for n in redis_cluster.primaries() if n.id != source.id)
    held = await store.claim(old, FP)
    assert held.outcome is Outcome.CLAIMED

    importing, migrating = (redis_cluster.server(n.port).client() for n in (target, source))
    with importing, migrating:
        importing.cluster("SETSLOT", slot, "IMPORTING", source.id)
        migrating.cluster("SETSLOT", slot, "MIGRATING", target.id)
        # The source holds `old` and answers for it; `new` it does not hold: ASK.
        fresh = await store.claim(new, FP)
        assert fresh.outcome is Outcome.CLAIMED
        assert _asking(importing, "EXISTS", _stored(store, new)) == 1
        with pytest.raises(AskError):  # the source holds no such key: asked elsewhere
            migrating.exists(_stored(store, new))
        assert (await store.claim(old, FP)).outcome is Outcome.IN_PROGRESS
        record = await store.get(new)
        assert record is not None
        assert record.fence == fresh.fence
        # One call over keys split between the two nodes cannot run: it waits.
        with pytest.raises(StoreUnavailable) as info:
            await store.claim_many([ClaimRequest(old, FP), ClaimRequest(new, FP)])
        assert isinstance(info.value.__cause__, TryAgainError)

        # The migration ends: `old` moves, the slot is the target's (MOVED from now on).
        # Every key of the slot moves: other tests' keys share the tag.
        names = migrating.cluster("GETKEYSINSLOT", slot, 10_000)
        assert _stored(store, old).decode() in names
        migrate = ("MIGRATE", HOST, target.port, "", 0, 5000, "KEYS", *names)
        migrating.execute_command(*migrate)  # type: ignore[no-untyped-call]
        for node in redis_cluster.primaries():
            with redis_cluster.server(node.port).client() as client:
                client.cluster("SETSLOT", slot, "NODE", target.id)
    again = await store.claim(old, FP)
    assert (again.outcome, again.fence) == (Outcome.IN_PROGRESS, held.fence)
    assert await store.complete(old, held.fence, "moved")
    assert await store.complete(new, fresh.fence, "imported")
    redis_cluster.wait_healthy()


def test_redirections_pass_under_cluster_and_misconfigure_one_server() -> None:
    moved = MovedError("3999 127.0.0.1:7001")
    assert isinstance(store_error("redis", moved, None, cluster=True), StoreUnavailable)
    assert isinstance(store_error("redis", moved, None), StoreMisconfigured)
    # A script over several slots is a bug of semel's under Cluster: raised as it came.
    crossed = ClusterCrossSlotError("Keys in request don't hash to the same slot")
    assert store_error("redis", crossed, None, cluster=True) is None


def _migrate(settings: Settings) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "semel.consumer.commands.app", "migrate"],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_cluster_node_behind_a_plain_url_stops_migrate(
    make_settings: SettingsFactory, redis_cluster: Cluster
) -> None:
    node = redis_cluster.servers[0].port
    done = _migrate(make_settings(redis_url=f"redis://{HOST}:{node}/0"))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "redis+cluster://" in line


async def test_a_plain_server_behind_a_cluster_url_is_misconfiguration(
    make_settings: SettingsFactory, redis_server: str
) -> None:
    url = redis_server.replace("redis://", "redis+cluster://").removesuffix("/0")
    store: Store = await open_store(make_settings(redis_url=url))
    try:
        with pytest.raises(StoreMisconfigured, match="not in cluster mode"):
            await store.migrate()
    finally:
        await store.close()
    assert "redis://" in NOT_A_CLUSTER


async def test_a_record_read_back_is_the_one_written(make_store: StoreFactory) -> None:
    store = await make_store()
    claims = decided(await store.claim_many([ClaimRequest(f"r{i}", FP) for i in range(50)]))
    assert await store.fail(claims[0].record.key, claims[0].fence, "no")
    assert await store.release(claims[1].record.key, claims[1].fence)
    record = await store.get(claims[0].record.key)
    assert record is not None
    assert record.status is Status.FAILED
    assert await store.reset(claims[0].record.key)


async def test_migrate_asks_every_primary(make_store: StoreFactory, redis_cluster: Cluster) -> None:
    store = await make_store(redis_replicas_ack=2)
    said = await store.migrate()
    primaries = sorted(f"{HOST}:{n.port}" for n in redis_cluster.primaries())
    # The test nodes keep nothing on disk and have one replica each: both said once,
    # naming every primary.
    assert len(said) == 2, said
    for warning in said:
        assert warning.endswith(f"(primaries {', '.join(primaries)})"), warning
    assert said[0].startswith(NO_PERSISTENCE)
    assert said[1].startswith(FEW_REPLICAS.format(wanted=2, replicas=1))


async def test_a_ping_failing_on_one_primary_waits_for_the_others(
    make_store: StoreFactory, redis_cluster: Cluster
) -> None:
    # One primary fails at once, another answers late: the ping fails, and nothing it
    # asked is left running (a call still out could outlive the store's close).
    store = await make_store()
    await store.ping()  # a connection to every primary, kept for the next round trip
    before = asyncio.all_tasks()
    failing, late, *_ = redis_cluster.primaries()
    with redis_cluster.server(late.port).client() as client:
        client.client_pause(1500)
    with redis_cluster.server(failing.port).client() as client:
        client.client_kill_filter(_type="normal", skipme=True)
    with pytest.raises(StoreUnavailable):
        await store.ping()
    assert store_tasks(before) == []

"""A Redis that answers with an error: each refusal of a real server becomes the store
error the consumer acts on, and a foreign value at one key is refused alone.

Every test runs its own ``redis-server`` in a temporary directory, so filling
it, breaking its snapshots or reconfiguring it disturbs no other test (the
shared server on 6379 is never touched).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ClusterCrossSlotError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from semel.stores.base import Claim, ClaimRequest, Completion, Outcome, Status, Store, StoreConfig
from semel.stores.errors import EXIT_USAGE, KeyRefused, StoreMisconfigured, StoreUnavailable
from semel.stores.redis.store import open_store
from tests.fences import clock_us, started_fresh
from tests.servers import free_port, wait_for_port

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]

FP = "f" * 64
DEADLINE = 10.0  # seconds any awaited server state may take to show


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``condition`` until it holds; fail after :data:`DEADLINE` seconds."""
    deadline = time.monotonic() + DEADLINE
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {DEADLINE:g}s")
        await asyncio.sleep(0.02)


@dataclass
class PrivateRedis:
    """One disposable ``redis-server``, a plain client on it, and the stores opened on it."""

    port: int
    workdir: Path
    process: asyncio.subprocess.Process
    client: Redis
    stores: list[Store] = field(default_factory=list)
    stopped: bool = False

    def url(self, credentials: str = "") -> str:
        at = f"{credentials}@" if credentials else ""
        return f"redis://{at}127.0.0.1:{self.port}/0"

    async def store(self, credentials: str = "") -> Store:
        """A store on this server, under a key prefix of its own; closed with the server."""
        config = StoreConfig(key_prefix="t" + uuid.uuid4().hex[:12])
        store = await open_store(url=self.url(credentials), connections=4, config=config)
        self.stores.append(store)
        return store

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for store in self.stores:
            await store.close()
        await self.client.aclose()
        if self.process.returncode is None:
            self.process.terminate()
            try:
                # A server with save points saves on SIGTERM, and stays up if it cannot.
                await asyncio.wait_for(self.process.wait(), 5.0)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


StartRedis = Callable[..., Awaitable[PrivateRedis]]


@pytest.fixture
async def start_redis(tmp_path: Path) -> AsyncIterator[StartRedis]:
    """Start private servers (``redis-server`` options as arguments); all stopped after.

    ``like=`` restarts on the port and directory of a stopped server, so it
    loads what that one saved; ``ready=False`` returns once the port is open
    rather than once the server answers.
    """
    started: list[PrivateRedis] = []

    async def start(
        *options: str, like: PrivateRedis | None = None, ready: bool = True
    ) -> PrivateRedis:
        port = like.port if like else free_port()
        workdir = like.workdir if like else tmp_path / f"redis-{port}"
        workdir.mkdir(exist_ok=True)
        process = await asyncio.create_subprocess_exec(
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--dir", str(workdir)),
            *("--logfile", str(workdir / "redis.log"), *options),
        )
        server = PrivateRedis(port, workdir, process, plain_client(port))
        started.append(server)
        await asyncio.to_thread(wait_for_port, port, DEADLINE)
        if ready:
            await until(lambda: answers_ping(server.client), f"redis-server on {port} answers")
        return server

    yield start
    for server in reversed(started):
        await server.stop()


def plain_client(port: int) -> Redis:
    """A client that tries each command once, to see what the server answers first."""
    return Redis(port=port, retry=Retry(NoBackoff(), 0))


async def answers_ping(client: Redis) -> bool:
    try:
        return bool(await client.ping())
    except RedisConnectionError:  # LOADING is one
        return False


async def fill(client: Redis) -> None:
    """Write 10 kB values until the server refuses one for want of memory."""
    for i in range(1_000):
        try:
            await client.set(f"fill:{i}", b"x" * 10_000)
        except OutOfMemoryError:
            return
    raise AssertionError("10 MB written and the server never full")


async def test_a_full_server_is_unavailable_until_memory_is_freed(start_redis: StartRedis) -> None:
    server = await start_redis()
    store = await server.store()
    held = await store.claim("held", FP)
    client = server.client
    used = (await client.info("memory"))["used_memory"]
    await client.config_set("maxmemory-policy", "noeviction")
    await client.config_set("maxmemory", used + 2**20)
    await fill(client)
    # The last write let in may have passed the limit by a few bytes, which a
    # freed buffer gives back; below what is used now, the server stays full.
    used = (await client.info("memory"))["used_memory"]
    await client.config_set("maxmemory", used - 2**19)

    with pytest.raises(StoreUnavailable) as info:
        await store.claim("new", FP)
    assert isinstance(info.value.__cause__, OutOfMemoryError)
    with pytest.raises(StoreUnavailable):
        await store.complete("held", held.fence, {"ok": True})
    with pytest.raises(StoreUnavailable):
        await store.claim_many([ClaimRequest("new", FP), ClaimRequest("new2", FP)])
    with pytest.raises(StoreUnavailable):
        await store.complete_many([Completion("held", held.fence, b"1")])
    assert not await client.exists(store.config.namespaced("new"))
    assert await client.hget(store.config.namespaced("held"), "status") == b"in_progress"

    await client.config_set("maxmemory", 0)
    assert (await store.claim("new", FP)).outcome is Outcome.CLAIMED
    assert await store.complete("held", held.fence, {"ok": True})


async def last_snapshot_was(client: Redis, status: str) -> bool:
    """Whether no snapshot is running and the last one ended ``ok`` or ``err``."""
    persistence = await client.info("persistence")
    return not persistence["rdb_bgsave_in_progress"] and (
        persistence["rdb_last_bgsave_status"] == status
    )


async def test_failing_snapshots_make_the_server_unavailable_until_one_succeeds(
    start_redis: StartRedis,
) -> None:
    # MISCONF: save points are set, stop-writes-on-bgsave-error is on (the
    # default) and the last snapshot failed. The test runs as root, for whom
    # no directory is read-only, so a directory takes the snapshot's name: the
    # save writes its temporary file, then cannot rename it over a directory.
    server = await start_redis()
    store = await server.store()
    held = await store.claim("held", FP)
    client = server.client
    snapshot = server.workdir / "dump.rdb"
    snapshot.mkdir()
    await client.config_set("save", "3600 1")
    await client.bgsave()
    await until(lambda: last_snapshot_was(client, "err"), "the snapshot failed")

    with pytest.raises(StoreUnavailable) as info:
        await store.claim("new", FP)
    assert str(info.value.__cause__).startswith("MISCONF ")
    with pytest.raises(StoreUnavailable):
        await store.complete("held", held.fence, {"ok": True})
    with pytest.raises(StoreUnavailable):
        await store.ping()  # Redis refuses PING too while its snapshots fail
    record = await store.get("held")  # reads still go through
    assert record is not None
    assert record.status is Status.IN_PROGRESS

    snapshot.rmdir()
    await client.bgsave()
    await until(lambda: last_snapshot_was(client, "ok"), "the snapshot succeeded")
    assert (await store.claim("new", FP)).outcome is Outcome.CLAIMED
    assert await store.complete("held", held.fence, {"ok": True})
    await store.ping()


async def test_a_long_script_makes_the_server_unavailable_until_killed(
    start_redis: StartRedis,
) -> None:
    server = await start_redis("--busy-reply-threshold", "50")
    store = await server.store()
    held = await store.claim("held", FP)
    looper = plain_client(server.port)

    async def loop_forever() -> object:
        return await looper.eval("while true do end", 0)

    running = asyncio.create_task(loop_forever())

    async def busy() -> bool:
        try:
            await server.client.ping()
        except ResponseError as exc:
            return str(exc).startswith("BUSY ")
        return False

    try:
        await until(busy, "the server answers BUSY")
        with pytest.raises(StoreUnavailable) as info:
            await store.claim("new", FP)
        assert str(info.value.__cause__).startswith("BUSY ")
        with pytest.raises(StoreUnavailable):
            await store.complete("held", held.fence, {"ok": True})
        with pytest.raises(StoreUnavailable):
            await store.ping()
        await server.client.script_kill()
        with pytest.raises(ResponseError, match="killed"):
            await running
    finally:
        if not running.done():  # the test failed before the kill
            with contextlib.suppress(ResponseError):
                await server.client.script_kill()
            with contextlib.suppress(ResponseError):
                await running
        await looper.aclose()
    assert (await store.claim("new", FP)).outcome is Outcome.CLAIMED
    assert await store.complete("held", held.fence, {"ok": True})


async def test_a_loading_server_is_unavailable_until_loaded(start_redis: StartRedis) -> None:
    first = await start_redis()
    async with first.client.pipeline(transaction=False) as pipe:
        for i in range(20_000):
            pipe.set(f"data:{i}", "v")
        await pipe.execute()
    await first.client.save()
    await first.stop()
    # key-load-delay (µs per key) stretches the load to seconds; the server
    # answers (LOADING) between every KB it reads.
    server = await start_redis(
        *("--key-load-delay", "500", "--loading-process-events-interval-bytes", "1024"),
        like=first,
        ready=False,
    )
    store = await server.store()

    async def loading() -> bool:
        try:
            await server.client.ping()
        except BusyLoadingError:
            return True
        except RedisConnectionError:
            return False
        raise AssertionError("loaded before the test could see it loading")

    await until(loading, "the server answers LOADING")
    with pytest.raises(StoreUnavailable) as info:
        await store.claim("k", FP)
    assert isinstance(info.value.__cause__, BusyLoadingError)
    with pytest.raises(StoreUnavailable):
        await store.ping()
    await server.client.config_set("key-load-delay", 0)
    await until(lambda: answers_ping(server.client), "the server loaded")
    assert (await store.claim("k", FP)).outcome is Outcome.CLAIMED


@pytest.mark.parametrize(
    ("user", "keys", "denied", "credentials"),
    [
        ("no-evalsha", "*", ["-evalsha"], "no-evalsha:pw"),
        ("other-keys", "other:*", [], "other-keys:pw"),
        ("no-hset", "*", ["-hset"], "no-hset:pw"),  # refused inside the script
        ("wrong-password", "*", [], "wrong-password:not-pw"),
    ],
)
async def test_an_acl_refusal_is_misconfiguration(
    start_redis: StartRedis, user: str, keys: str, denied: list[str], credentials: str
) -> None:
    server = await start_redis()
    await server.client.acl_setuser(
        user, enabled=True, passwords=["+pw"], keys=[keys], commands=["+@all", *denied]
    )
    store = await server.store(credentials)
    with pytest.raises(StoreMisconfigured) as info:
        await store.claim("k", FP)
    assert info.value.exit_code == EXIT_USAGE
    with pytest.raises(StoreMisconfigured):
        await store.claim_many([ClaimRequest("k", FP), ClaimRequest("k2", FP)])
    assert await server.client.keys(store.config.namespaced("*")) == []


async def test_a_missing_password_is_misconfiguration(start_redis: StartRedis) -> None:
    server = await start_redis("--requirepass", "pw", ready=False)
    with pytest.raises(StoreMisconfigured, match="credentials") as info:
        await (await server.store()).claim("k", FP)
    assert isinstance(info.value.__cause__, AuthenticationError)
    assert (await (await server.store(":pw")).claim("k", FP)).outcome is Outcome.CLAIMED


async def test_a_disabled_evalsha_is_misconfiguration(start_redis: StartRedis) -> None:
    server = await start_redis("--rename-command", "EVALSHA", "")
    store = await server.store()
    with pytest.raises(StoreMisconfigured, match="lacks a command"):
        await store.claim("k", FP)
    await store.ping()  # the server answers: it is only not set up for semel


@pytest.mark.parametrize(
    ("stale_reads", "refusal"), [("yes", ReadOnlyError), ("no", MasterDownError)]
)
async def test_a_replica_is_unavailable(
    start_redis: StartRedis, stale_reads: str, refusal: type[Exception]
) -> None:
    # A replica whose master is gone, as clients see one until they follow a
    # failover: it refuses writes (READONLY), or everything (MASTERDOWN) when
    # told not to serve stale data.
    replica = await start_redis(
        *("--replicaof", "127.0.0.1", str(free_port())),
        *("--replica-serve-stale-data", stale_reads),
        ready=False,
    )
    store = await replica.store()
    with pytest.raises(StoreUnavailable) as info:
        await store.claim("k", FP)
    assert isinstance(info.value.__cause__, refusal)
    with pytest.raises(StoreUnavailable):
        await store.claim_many([ClaimRequest("k", FP), ClaimRequest("k2", FP)])


def cluster_node(bus_port: int | None = None) -> tuple[str, ...]:
    """Options of a cluster node; its bus port is chosen too (port + 10000 may not exist)."""
    bus = str(bus_port or free_port())
    return (
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-port",
        bus,
    )


async def test_a_cluster_is_misconfiguration_and_a_cluster_down_unavailable(
    start_redis: StartRedis,
) -> None:
    server = await start_redis(*cluster_node())
    store = await server.store()
    # A cluster node serving no slot: the cluster is down, which passes.
    with pytest.raises(StoreUnavailable) as info:
        await store.claim("a", FP)
    assert isinstance(info.value.__cause__, ClusterDownError)

    await server.client.cluster("ADDSLOTSRANGE", "0", "16383")

    async def cluster_ok() -> bool:
        info = await server.client.cluster("INFO")
        return bool(info["cluster_state"] == "ok")

    await until(cluster_ok, "the one-node cluster serves every slot")
    # One key per script is what a cluster allows; a batch spans slots.
    assert (await store.claim("a", FP)).outcome is Outcome.CLAIMED
    keys = [store.config.namespaced(k) for k in ("a", "b")]
    assert key_slot(keys[0].encode()) != key_slot(keys[1].encode())
    with pytest.raises(StoreMisconfigured) as refused:
        await store.claim_many([ClaimRequest("a", FP), ClaimRequest("b", FP)])
    assert isinstance(refused.value.__cause__, ClusterCrossSlotError)


async def test_a_cluster_node_redirecting_is_misconfiguration(start_redis: StartRedis) -> None:
    bus_port = free_port()
    asked, owner = await start_redis(*cluster_node()), await start_redis(*cluster_node(bus_port))
    await owner.client.cluster("ADDSLOTSRANGE", "0", "16383")
    await asked.client.cluster("MEET", "127.0.0.1", str(owner.port), str(bus_port))
    store = await asked.store()
    refused: list[StoreMisconfigured] = []

    async def redirected() -> bool:
        try:
            await store.claim("k", FP)
        except StoreUnavailable:  # CLUSTERDOWN until the node learns who serves the slot
            return False
        except StoreMisconfigured as exc:
            refused.append(exc)
            return True
        raise AssertionError("a node serving no slot claimed a key")

    await until(redirected, "the node answers MOVED")
    assert isinstance(refused[0].__cause__, MovedError)


async def test_a_foreign_key_in_a_claim_batch_is_refused_alone(start_redis: StartRedis) -> None:
    server = await start_redis()
    store = await server.store()
    foreign = store.config.namespaced("k2")
    await server.client.set(foreign, b"not semel's")
    requests = [ClaimRequest(k, FP) for k in ("k1", "k2", "k3")]

    since = clock_us()
    first, refused, third = await store.claim_many(requests)
    assert isinstance(refused, KeyRefused)
    assert refused.key == "k2"
    assert "a Redis string holds the key" in str(refused)
    assert isinstance(first, Claim)
    assert isinstance(third, Claim)
    assert (first.outcome, first.record.key) == (Outcome.CLAIMED, "k1")
    assert (third.outcome, third.record.key) == (Outcome.CLAIMED, "k3")
    assert started_fresh(first.fence, since)
    assert started_fresh(third.fence, since)
    # Records read back around a refused key decode as usual.
    again = await store.claim_many(requests)
    assert [a.outcome if isinstance(a, Claim) else a.key for a in again] == [
        Outcome.IN_PROGRESS,
        "k2",
        Outcome.IN_PROGRESS,
    ]
    assert await server.client.get(foreign) == b"not semel's"
    assert await server.client.pttl(foreign) == -1  # not even an expiry was set


async def test_a_foreign_key_in_a_completion_batch_is_refused_alone(
    start_redis: StartRedis,
) -> None:
    server = await start_redis()
    store = await server.store()
    keys = ("k1", "k2", "k3")
    claims = [await store.claim(k, FP) for k in keys]
    foreign = store.config.namespaced("k2")
    await server.client.set(foreign, b"not semel's")  # replaces the record after its claim

    done = [Completion(c.record.key, c.fence, store.encode_result(c.record.key)) for c in claims]
    first, refused, third = await store.complete_many(done)
    assert (first, third) == (True, True)
    assert isinstance(refused, KeyRefused)
    assert refused.key == "k2"
    assert await server.client.get(foreign) == b"not semel's"
    assert await server.client.pttl(foreign) == -1
    for key in ("k1", "k3"):
        record = await store.get(key)
        assert record is not None
        assert (record.status, record.result) == (Status.COMPLETED, key)


@pytest.mark.parametrize("kind", ["string", "list"])
async def test_every_single_key_call_refuses_a_foreign_key(
    start_redis: StartRedis, kind: str
) -> None:
    server = await start_redis()
    store = await server.store()
    foreign = store.config.namespaced("k")
    if kind == "string":
        await server.client.set(foreign, b"not semel's")
    else:
        await server.client.rpush(foreign, b"not semel's")
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "claim": lambda: store.claim("k", FP),
        "complete": lambda: store.complete("k", 1, "result"),
        "release": lambda: store.release("k", 1),
        "fail": lambda: store.fail("k", 1, "error"),
        "heartbeat": lambda: store.heartbeat("k", 1),
        "get": lambda: store.get("k"),
        "reset": lambda: store.reset("k"),
    }
    for name, call in calls.items():
        with pytest.raises(KeyRefused) as info:
            await call()
        assert info.value.key == "k", name
    assert await server.client.type(foreign) == kind.encode()
    assert await server.client.pttl(foreign) == -1
    client = server.client
    value = await (client.get(foreign) if kind == "string" else client.lindex(foreign, 0))
    assert value == b"not semel's"


@pytest.mark.timeout(30)
async def test_a_wait_cut_short_by_a_failover_is_unavailable(start_redis: StartRedis) -> None:
    # A primary demoted while a write's WAIT is blocked (a planned failover of
    # Redis Cluster, REPLICAOF) answers the blocked client UNBLOCKED: the write
    # may or may not have reached a replica, as when a connection is lost.
    server = await start_redis()
    config = StoreConfig(key_prefix="t" + uuid.uuid4().hex[:12])
    store = await open_store(url=server.url(), connections=4, config=config, replicas_ack=1)
    server.stores.append(store)
    claim = asyncio.ensure_future(store.claim("k", FP))  # no replica: its WAIT blocks

    async def blocked() -> bool:
        return int((await server.client.info("clients"))["blocked_clients"]) >= 1

    await until(blocked, "the claim's WAIT is blocked")
    await server.client.replicaof("127.0.0.1", str(free_port()))
    with pytest.raises(StoreUnavailable, match="UNBLOCKED"):
        await claim

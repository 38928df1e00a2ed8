"""Redis-specific promises the shared contract cannot see: round trips, TTLs, key layout."""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from semel.stores.base import Claim, ClaimRequest, Completion, Outcome, Status, Store, answer_of
from semel.stores.errors import KeyRefused, StoreUnavailable
from semel.stores.redis.eval import Script, pack, pack_script
from semel.stores.redis.store import COMMAND_TIMEOUT, NO_PERSISTENCE
from tests.conftest import SettingsFactory, StoreFactory, open_store
from tests.fences import clock_us, started_fresh
from tests.servers import free_port, wait_for_port

pytestmark = pytest.mark.timeout(60)

FP = "f" * 64
OTHER_FP = "0" * 64


def _claimed(answers: Sequence[Claim | KeyRefused]) -> list[Claim]:
    """The claims of a batch no key of which was refused (a refusal is raised)."""
    return [answer_of(answer) for answer in answers]


@pytest.fixture
def backend() -> str:
    return "redis"


@pytest.fixture
async def server(redis_server: str) -> AsyncIterator[Redis]:
    """A plain client on the test server, to look behind the store's back."""
    client = Redis.from_url(redis_server)
    yield client
    await client.aclose()


async def _commands_sent(
    server: Redis, store: Store, prefix: str, work: Callable[[Store], Awaitable[None]]
) -> list[str]:
    """Every command the store's connection sent for ``work``, between two PINGs, per MONITOR.

    Commands run inside a script are reported as coming from ``lua`` and are
    not round trips, so only the client's own lines count. Other clients of
    the server may show up too; the store's port is the one naming ``prefix``.
    """
    lines: list[tuple[str, str]] = []
    port = None
    async with server.monitor() as monitor:
        await store.ping()
        await work(store)
        await store.ping()
        while port is None or lines[-1] != (port, "PING"):
            line = await monitor.next_command()
            if line["client_type"] != "lua":
                lines.append((line["client_port"], line["command"]))
                if port is None and prefix in line["command"]:
                    port = line["client_port"]
    own = [command for client, command in lines if client == port]
    assert own[0] == "PING"
    return own[1:-1]


async def _claims(store: Store, rt: str = "rt", done: str = "done") -> None:
    """One claim of each outcome."""
    first = await store.claim(rt, FP)
    assert first.outcome is Outcome.CLAIMED
    assert (await store.claim(rt, FP)).outcome is Outcome.IN_PROGRESS
    assert (await store.claim(rt, OTHER_FP)).outcome is Outcome.MISMATCH
    await store.release(rt, first.fence)
    second = await store.claim(rt, FP)
    assert second.outcome is Outcome.CLAIMED
    await store.release(rt, second.fence)
    assert (await store.claim(rt, FP)).outcome is Outcome.POISON
    assert (await store.claim(rt, FP)).outcome is Outcome.FAILED
    third = await store.claim(done, FP)
    await store.complete(done, third.fence, {"ok": True})
    assert (await store.claim(done, FP)).outcome is Outcome.DUPLICATE


async def test_each_operation_is_one_evalsha(make_store: StoreFactory, server: Redis) -> None:
    # One pooled connection, so every command of the store comes from one port.
    store = await make_store(prefetch=1, max_claims=2)
    # A script unknown to the server costs a NOSCRIPT and one EVAL, on first use.
    await _claims(store, "warm-rt", "warm-done")
    sent = await _commands_sent(server, store, store.config.key_prefix, _claims)
    # 8 claims, 2 releases, 1 complete: one EVALSHA each, nothing else.
    assert len(sent) == 11, sent
    assert all(command.startswith("EVALSHA ") for command in sent), sent


async def _batches(store: Store) -> None:
    """One claim_many and one complete_many of 50 keys each."""
    claims = _claimed(await store.claim_many([ClaimRequest(f"b{i}", FP) for i in range(50)]))
    assert {c.outcome for c in claims} == {Outcome.CLAIMED}
    done = [Completion(c.record.key, c.fence, store.encode_result(i)) for i, c in enumerate(claims)]
    assert await store.complete_many(done) == [True] * 50


async def test_each_batch_is_one_evalsha(make_store: StoreFactory, server: Redis) -> None:
    store = await make_store(prefetch=1, max_claims=2)
    await _claims(store, "warm-rt", "warm-done")
    sent = await _commands_sent(server, store, store.config.key_prefix, _batches)
    assert len(sent) == 2, sent
    assert all(command.startswith("EVALSHA ") for command in sent), sent


async def test_record_is_one_key_with_retention_ttl(
    make_store: StoreFactory, server: Redis
) -> None:
    store = await make_store(retention=60.0, lock_ttl=5.0)
    key = store.config.namespaced("k")
    claim = await store.claim("k", FP)
    assert await store.complete("k", claim.fence, [1, 2])
    assert await server.keys(store.config.namespaced("*")) == [key.encode()]
    ttl = await server.pttl(key)
    assert 55_000 < ttl <= 60_000
    record = await store.get("k")
    assert record is not None
    assert record.expires_at is not None
    assert abs(record.expires_at.timestamp() - (time.time() + 60)) < 5


async def test_live_lease_outlives_a_shorter_retention(
    make_settings: SettingsFactory, server: Redis
) -> None:
    # Were the record to expire first, a copy would be claimed while its owner
    # still runs (the owner's writes then refused). Settings refuse a retention
    # shorter than the lease; the store stays safe without that check.
    settings = make_settings().model_copy(update={"retention": 1.0, "lock_ttl": 20.0})
    store = await open_store(settings)
    try:
        key = store.config.namespaced("k")
        claim = await store.claim("k", FP)
        assert await server.pttl(key) > 15_000
        assert await store.heartbeat("k", claim.fence)
        assert await server.pttl(key) > 15_000
        assert await store.release("k", claim.fence)
        assert await server.pttl(key) <= 1_000
    finally:
        await store.close()


async def test_lease_is_taken_from_the_server_clock(make_store: StoreFactory) -> None:
    store = await make_store(lock_ttl=7.5)
    claim = await store.claim("k", FP)
    lease, updated = claim.record.lease_expires_at, claim.record.updated_at
    assert lease is not None
    assert updated is not None
    assert (lease - updated).total_seconds() == 7.5


async def test_claim_survives_a_script_cache_flush(make_store: StoreFactory, server: Redis) -> None:
    # A restart or failover empties the script cache; EVALSHA must recover.
    store = await make_store()
    await store.claim("before", FP)
    await server.script_flush()
    assert (await store.claim("after", FP)).outcome is Outcome.CLAIMED


async def test_batches_survive_a_script_cache_flush(
    make_store: StoreFactory, server: Redis
) -> None:
    store = await make_store()
    await store.claim_many([ClaimRequest("before", FP)])
    await server.script_flush()
    since = clock_us()
    claims = _claimed(await store.claim_many([ClaimRequest(f"after-{i}", FP) for i in range(5)]))
    assert [c.outcome for c in claims] == [Outcome.CLAIMED] * 5
    # Claimed once: the reload ran nothing twice.
    assert [c.record.claims for c in claims] == [1] * 5
    assert all(started_fresh(c.fence, since) for c in claims)
    stored = [await store.get(c.record.key) for c in claims]
    assert [r and r.fence for r in stored] == [c.fence for c in claims]  # as the script wrote
    await server.script_flush()
    done = [Completion(c.record.key, c.fence, store.encode_result("ok")) for c in claims]
    assert await store.complete_many(done) == [True] * 5


async def test_claims_survive_a_script_cache_flushed_all_the_time(
    make_store: StoreFactory, server: Redis
) -> None:
    # Another client flushing the cache between our reload and our resend
    # must not fail the call: the resend carries the script itself.
    store = await make_store()
    flushing = True

    async def flush() -> None:
        while flushing:
            await server.script_flush()

    flusher = asyncio.create_task(flush())
    since = clock_us()
    try:
        claims = [await store.claim(f"k{i}", FP) for i in range(200)]
    finally:
        flushing = False
        await flusher
    assert [c.outcome for c in claims] == [Outcome.CLAIMED] * 200
    assert [c.record.claims for c in claims] == [1] * 200
    assert all(started_fresh(c.fence, since) for c in claims)


async def test_free_text_and_results_survive_the_reply(
    make_store: StoreFactory, server: Redis
) -> None:
    # Replies are JSON built inside the scripts: quoting must hold for any text.
    store = await make_store()
    odd = 'quote " backslash \\ slash / tab \t newline \n nul \x00 ünï €'
    claim = await store.claim("failed", FP)
    assert await store.fail("failed", claim.fence, odd)
    claim = await store.claim("done", odd)
    result = {"text": odd, "nested": [1, 2.5, None, True, {"k": "v"}], "big": 2**62}
    assert await store.complete("done", claim.fence, result)
    failed, done, mismatch = _claimed(
        await store.claim_many(
            [ClaimRequest("failed", FP), ClaimRequest("done", odd), ClaimRequest("done", FP)]
        )
    )
    assert (failed.outcome, failed.record.error) == (Outcome.FAILED, odd)
    assert (done.outcome, done.record.result) == (Outcome.DUPLICATE, result)
    assert (mismatch.outcome, mismatch.record.fingerprint) == (Outcome.MISMATCH, odd)
    # With its expiry removed by hand, a record says nothing will forget it.
    await server.persist(store.config.namespaced("done"))
    record = await store.get("done")
    assert record is not None
    assert (record.status, record.expires_at) == (Status.COMPLETED, None)


async def test_a_url_asking_for_decoded_replies_changes_nothing(
    make_settings: SettingsFactory, redis_server: str
) -> None:
    store = await open_store(make_settings(redis_url=f"{redis_server}?decode_responses=True"))
    try:
        claims = _claimed(await store.claim_many([ClaimRequest("a", FP), ClaimRequest("b", FP)]))
        done = [Completion(c.record.key, c.fence, store.encode_result(1)) for c in claims]
        assert await store.complete_many(done) == [True, True]
        assert (await store.claim("a", FP)).record.result == 1
    finally:
        await store.close()


async def test_migrate_warns_only_without_persistence(
    make_store: StoreFactory, server: Redis
) -> None:
    store = await make_store()
    config = await server.config_get("appendonly", "save")
    volatile = config["appendonly"] == "no" and not config["save"]
    assert (await store.migrate()) == ([NO_PERSISTENCE] if volatile else [])


@pytest.mark.parametrize(
    "url",
    ["redis://semel:s3cret-pw@127.0.0.1:1/0", "unix:///nonexistent/semel-redis.sock?db=0"],
)
async def test_unreachable_raises_unavailable_without_password(
    make_settings: SettingsFactory, url: str
) -> None:
    store = await open_store(make_settings(redis_url=url))
    started = time.monotonic()
    try:
        with pytest.raises(StoreUnavailable) as info:
            await store.claim("k", FP)
    finally:
        await store.close()
    assert time.monotonic() - started < 3
    assert isinstance(info.value.__cause__, RedisConnectionError)
    assert "s3cret-pw" not in str(info.value)


async def _start_redis(port: int, workdir: Path) -> asyncio.subprocess.Process:
    """A private, disposable Redis, so stopping it disturbs no other test."""
    proc = await asyncio.create_subprocess_exec(
        *("redis-server", "--port", str(port), "--bind", "127.0.0.1"),
        *("--save", "", "--appendonly", "no", "--dir", str(workdir)),
        stdout=asyncio.subprocess.DEVNULL,
    )
    await asyncio.to_thread(wait_for_port, port, 10.0)
    return proc


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
async def test_stopped_server_is_unavailable_then_recovers(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    port = free_port()
    server = await _start_redis(port, tmp_path)
    store = await open_store(make_settings(redis_url=f"redis://127.0.0.1:{port}/0"))
    try:
        assert (await store.claim("k", FP)).outcome is Outcome.CLAIMED
        server.terminate()
        await server.wait()
        with pytest.raises(StoreUnavailable):
            await store.claim("k", FP)
        # A batch fails as a whole, like a single call.
        with pytest.raises(StoreUnavailable):
            await store.claim_many([ClaimRequest("k", FP), ClaimRequest("k2", FP)])
        with pytest.raises(StoreUnavailable):
            await store.complete_many([Completion("k", 1, b"1"), Completion("k2", 1, b"2")])
        server = await _start_redis(port, tmp_path)
        # The pooled connection died with the old server; a new one is opened
        # and the new server's empty script cache is filled on the way.
        assert (await store.claim("k", FP)).outcome is Outcome.CLAIMED
        claims = _claimed(await store.claim_many([ClaimRequest("k", FP), ClaimRequest("k2", FP)]))
        assert [c.outcome for c in claims] == [Outcome.IN_PROGRESS, Outcome.CLAIMED]
    finally:
        await store.close()
        server.terminate()
        await server.wait()


async def test_silent_server_is_unavailable_within_the_timeout(
    make_settings: SettingsFactory,
) -> None:
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        store = await open_store(make_settings(redis_url=f"redis://127.0.0.1:{port}/0"))
        started = time.monotonic()
        try:
            with pytest.raises(StoreUnavailable):
                await store.claim("k", FP)
        finally:
            await store.close()
    assert time.monotonic() - started < COMMAND_TIMEOUT + 1


def test_the_retry_after_noscript_is_the_same_call_as_eval() -> None:
    script = Script("return #KEYS")
    command = pack_script(script, [b"k1", b"k2"], [b"a"])
    assert script.as_eval(command) == pack(b"EVAL", script.text, b"2", b"k1", b"k2", b"a")
    with pytest.raises(ValueError, match="not an EVALSHA"):
        Script("return 1").as_eval(command)

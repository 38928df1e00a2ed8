"""PostgreSQL batches: one statement each, and the single-key answer for every key."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

import orjson
import psycopg
import pytest

from semel.stores.base import ClaimRequest, Completion, Outcome, Store
from semel.stores.postgres.store import PostgresStore
from tests.conftest import StoreFactory
from tests.fences import clock_us, started_fresh
from tests.stores.race import decided
from tests.stores.test_postgres import statements_sent

pytestmark = pytest.mark.timeout(90)

FP = "f" * 64
OTHER_FP = "0" * 64
KINDS = 9  # the states prepare() leaves keys in, by index modulo KINDS


@pytest.fixture
def backend() -> str:
    return "postgres"


def pg(store: Store) -> PostgresStore:
    return cast(PostgresStore, store)


async def sql(dsn: str, statement: str, *params: Any) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(statement.encode(), params)


async def prepare(store: Store, dsn: str, n: int) -> list[ClaimRequest]:
    """Keys in every state a claim can meet, and the requests that claim them."""
    table = pg(store)._table

    async def one(i: int) -> ClaimRequest:
        key, kind = f"k{i}", i % KINDS
        if kind == 0:  # never seen
            return ClaimRequest(key, FP)
        claim = await store.claim(key, FP)
        if kind == 2:
            assert await store.complete(key, claim.fence, {"i": i})
        elif kind == 3:
            assert await store.fail(key, claim.fence, f"boom {i}")
        elif kind == 4:  # completed, then reused with another body
            assert await store.complete(key, claim.fence, i)
            return ClaimRequest(key, OTHER_FP)
        elif kind == 5:  # max_claims=2 used up: the next claim poisons it
            assert await store.release(key, claim.fence)
            again = await store.claim(key, FP)
            assert await store.release(key, again.fence)
        elif kind == 6:
            assert await store.release(key, claim.fence)
        elif kind in (7, 8):
            # 7: the lease ran out without a release; 8: completed, then forgotten
            if kind == 8:
                assert await store.complete(key, claim.fence, "old")
            column = "lock_expires_at" if kind == 7 else "expires_at"
            await sql(
                dsn,
                f"UPDATE {table} SET {column} = now() - interval '1 second' WHERE key = %s",
                store.config.namespaced(key),
            )
        return ClaimRequest(key, FP)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def fences_before(store: Store, dsn: str) -> dict[str, int]:
    """The fence of each of the store's keys that has a row, by the caller's key."""
    prefix = store.config.namespaced("")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            f"SELECT key, fence FROM {pg(store)._table} WHERE starts_with(key, %s)".encode(),
            (prefix,),
        )
        return {key.removeprefix(prefix): fence for key, fence in await cur.fetchall()}


def fence_shape(key: str, fence: int, before: dict[str, int], since: int) -> object:
    """How a fence relates to the key's fence before (0: kept, 1: taken over), or
    "clock" when it was started from the clock (no row, or one past retention)."""
    if key in before and fence - before[key] in (0, 1):
        return fence - before[key]
    fresh = started_fresh(fence, since) and fence > before.get(key, 0)
    return "clock" if fresh else fence


def summary(claim: Any, before: dict[str, int], since: int) -> tuple[Any, ...]:
    r = claim.record
    fence = fence_shape(r.key, r.fence, before, since)
    return (claim.outcome, r.key, r.fingerprint, r.status, fence, r.claims, r.result, r.error)


async def test_full_batch_answers_as_single_claims_would(
    make_store: StoreFactory, postgres_server: str
) -> None:
    batch_store = await make_store(max_claims=2)
    single_store = await make_store(max_claims=2, key_prefix=batch_store.config.key_prefix + "1")
    requests = await prepare(batch_store, postgres_server, 256)
    assert requests == await prepare(single_store, postgres_server, 256)

    before = {
        store: await fences_before(store, postgres_server) for store in (batch_store, single_store)
    }
    since = clock_us()
    batched = decided(await batch_store.claim_many(requests))
    singles = [await single_store.claim(r.key, r.fingerprint) for r in requests]
    left = [summary(c, before[batch_store], since) for c in batched]
    assert left == [summary(c, before[single_store], since) for c in singles]
    assert {shape for _, _, _, _, shape, *_ in left} == {0, 1, "clock"}
    assert [c.outcome for c in batched[:KINDS]] == [
        Outcome.CLAIMED,
        Outcome.IN_PROGRESS,
        Outcome.DUPLICATE,
        Outcome.FAILED,
        Outcome.MISMATCH,
        Outcome.POISON,
        Outcome.CLAIMED,
        Outcome.CLAIMED,
        Outcome.CLAIMED,
    ]

    # Completions: the granted fence, a stale one, keys not in progress, a missing key.
    def completions(store: Store, claims: list[Any]) -> list[Completion]:
        out = []
        for i, claim in enumerate(claims):
            fence = claim.fence - (i % 2) * (claim.outcome is Outcome.CLAIMED)
            out.append(Completion(claim.record.key, fence, store.encode_result([i])))
        return [*out, Completion("missing", 1, b"null")]

    written = decided(await batch_store.complete_many(completions(batch_store, batched)))
    one_by_one = [
        await single_store.complete_encoded(c) for c in completions(single_store, singles)
    ]
    assert written == one_by_one
    # The holders of the "held" keys (their fence is in the answer) complete too.
    assert written.count(True) == sum(
        1
        for i, c in enumerate(batched)
        if (c.outcome is Outcome.CLAIMED and i % 2 == 0) or c.outcome is Outcome.IN_PROGRESS
    )
    for i in range(KINDS * 2):
        got_left, got_right = await batch_store.get(f"k{i}"), await single_store.get(f"k{i}")
        assert got_left is not None
        assert got_right is not None
        key = f"k{i}"
        assert (got_left.status, got_left.result) == (got_right.status, got_right.result)
        shapes = [
            fence_shape(key, record.fence, before[store], since)
            for record, store in ((got_left, batch_store), (got_right, single_store))
        ]
        assert shapes[0] == shapes[1]


async def test_rows_that_change_between_refusal_and_read(
    make_store: StoreFactory, postgres_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = pg(await make_store())
    keys = ["done", "released", "purged", "held"]
    fences = {key: (await store.claim(key, FP)).fence for key in keys}
    sent: list[str] = []
    rows = store._rows

    async def meddling(cur: Any, statement: Any, params: dict[str, Any]) -> list[Any]:
        sent.append("read" if statement is store._sql.inspect_many else "claim")
        if sent == ["claim", "read"]:  # every key was refused: change three before the read
            assert await store.complete("done", fences["done"], "by the owner")
            assert await store.release("released", fences["released"])
            await sql(
                postgres_server,
                f"DELETE FROM {store._table} WHERE key = %s",
                store.config.namespaced("purged"),
            )
        return await rows(cur, statement, params)

    monkeypatch.setattr(store, "_rows", meddling)
    order = list(reversed(keys))
    claims = decided(await store.claim_many([ClaimRequest(key, FP) for key in order]))
    assert [c.record.key for c in claims] == order
    by_key = {c.record.key: c for c in claims}
    assert by_key["held"].outcome is Outcome.IN_PROGRESS
    assert by_key["held"].fence == fences["held"]
    assert by_key["done"].outcome is Outcome.DUPLICATE
    assert by_key["done"].record.result == "by the owner"
    # Claimable again by the time of the read: decided by a second claim round.
    released, purged = by_key["released"], by_key["purged"]
    assert (released.outcome, released.fence) == (Outcome.CLAIMED, fences["released"] + 1)
    assert purged.outcome is Outcome.CLAIMED
    assert purged.fence > fences["purged"]  # the row was gone: the clock, later
    assert sent == ["claim", "read", "claim"]


async def test_one_statement_per_batch_unless_refused(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await make_store()
    statements = statements_sent(monkeypatch)

    def first_words() -> list[str]:
        return [text.split()[0] for text in statements]

    keys = [f"s{i}" for i in range(256)]
    claims = decided(await store.claim_many([ClaimRequest(k, FP) for k in keys]))
    sent = first_words()
    assert sent == ["INSERT"]
    done = [Completion(c.record.key, c.fence, b"1") for c in claims]
    assert await store.complete_many(done) == [True] * 256
    sent = first_words()
    assert sent == ["INSERT", "UPDATE"]
    again = decided(await store.claim_many([ClaimRequest(k, FP) for k in keys]))
    assert {c.outcome for c in again} == {Outcome.DUPLICATE}
    sent = first_words()
    assert sent == ["INSERT", "UPDATE", "INSERT", "SELECT"]


async def test_batches_in_opposite_orders_do_not_deadlock(make_store: StoreFactory) -> None:
    store = await make_store()
    keys = [f"d{i:03}" for i in range(64)]
    for key in keys:
        await store.claim(key, FP)  # held: every later claim locks the row and is refused
    forward = [ClaimRequest(k, FP) for k in keys]
    backward = list(reversed(forward))
    loop = asyncio.get_running_loop()
    start = loop.time()
    for _ in range(10):
        batches = (store.claim_many(r) for r in [forward, backward] * 3)
        answers = [decided(a) for a in await asyncio.gather(*batches)]
        assert all(c.outcome is Outcome.IN_PROGRESS for a in answers for c in a)
    # A deadlock is detected only after deadlock_timeout (1 s), then sent again.
    assert loop.time() - start < 5


async def test_a_lost_deadlock_is_sent_again(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await make_store()
    execute = psycopg.AsyncCursor.execute
    lost: list[str] = []

    async def losing(self: psycopg.AsyncCursor[Any], query: Any, *args: Any, **kw: Any) -> Any:
        if len(lost) < 2:
            lost.append(query.as_string(self).split()[0])
            raise psycopg.errors.DeadlockDetected("deadlock detected")
        return await execute(self, query, *args, **kw)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", losing)
    claims = decided(await store.claim_many([ClaimRequest("a", FP), ClaimRequest("b", FP)]))
    assert [c.outcome for c in claims] == [Outcome.CLAIMED, Outcome.CLAIMED]
    lost.clear()
    done = [Completion(c.record.key, c.fence, b"1") for c in claims]
    assert await store.complete_many(done) == [True, True]
    assert lost == ["UPDATE", "UPDATE"]


async def test_result_jsonb_cannot_hold_fails_alone(make_store: StoreFactory) -> None:
    store = await make_store()
    with pytest.raises(orjson.JSONEncodeError, match="U\\+0000"):
        store.encode_result({"text": "a\x00b"})
    # An escaped backslash before "u0000" is text, not the NUL escape.
    kept = ["\\u0000", "\\\\u0000"]
    claim = await store.claim("k", FP)
    with pytest.raises(orjson.JSONEncodeError):
        await store.complete("k", claim.fence, "\x00")
    assert await store.complete_many([Completion("k", claim.fence, store.encode_result(kept))])
    record = await store.get("k")
    assert record is not None
    assert record.result == kept


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.claim_many([ClaimRequest("k", FP), ClaimRequest("k", FP)]),
        lambda s: s.complete_many([Completion("k", 1, b"1"), Completion("k", 2, b"2")]),
    ],
)
async def test_a_key_twice_in_one_batch_is_a_caller_error(
    make_store: StoreFactory, call: Callable[[Store], Awaitable[Any]]
) -> None:
    store = await make_store()
    with pytest.raises(ValueError, match="twice"):
        await call(store)
    assert await store.get("k") is None

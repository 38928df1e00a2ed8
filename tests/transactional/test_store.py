"""The transactional store on the real server: one commit for everything, nothing
committed otherwise, and claims that answer at once when the key's row is locked."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection, sql

from semel.stores.base import JSON, Outcome, Status
from semel.stores.errors import FencedOut, StoreUnavailable
from semel.stores.postgres.outbox import Outbox
from semel.stores.postgres.outbox import schema as outbox_schema
from semel.stores.postgres.transactional import TransactionalStore, Work
from tests.conftest import SettingsFactory, StoreFactory, open_store
from tests.stores.test_postgres import statements
from tests.transactional.conftest import rows

pytestmark = pytest.mark.timeout(60)

FP = "f" * 64


def order(table: str, key: str, fence: int, messages: int = 1) -> Work:
    """A handler's work: one business row, ``messages`` staged messages."""

    async def work(conn: AsyncConnection[Any], outbox: Outbox) -> JSON:
        insert = sql.SQL("INSERT INTO {} (key, fence) VALUES (%s, %s)")
        await conn.execute(insert.format(sql.Identifier(table)), (key, fence))
        for n in range(messages):
            outbox.stage("orders", "order.recorded", {"key": key, "n": n}, {"x-n": n})
        return {"recorded": key}

    return work


async def tx_store(make_store: StoreFactory, **overrides: Any) -> TransactionalStore:
    store = await make_store(**overrides)
    assert isinstance(store, TransactionalStore)
    return store


async def count(db: AsyncConnection[Any], table: str, key: str | None = None) -> int:
    where = "" if key is None else " WHERE key = %s"
    statement = sql.SQL("SELECT count(*) FROM {}" + where).format(sql.Identifier(table))
    cur = await db.execute(statement, () if key is None else (key,))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_business_writes_messages_and_completion_commit_together(
    make_store: StoreFactory, db: AsyncConnection[Any], business_table: str, outbox_table: str
) -> None:
    store = await tx_store(make_store)
    claim = await store.claim("k", FP)
    result = await store.run_unit("k", claim.fence, order(business_table, "k", claim.fence, 2))
    assert result == {"recorded": "k"}
    assert await count(db, business_table, "k") == 1
    staged = await rows(db, "SELECT key, fence, headers, sent_at FROM {} ORDER BY id", outbox_table)
    assert [(r[0], r[1], r[2], r[3]) for r in staged] == [
        (store.config.namespaced("k"), claim.fence, {"x-n": n}, None) for n in range(2)
    ]
    record = await store.get("k")
    assert record is not None
    assert (record.status, record.result) == (Status.COMPLETED, result)
    # The pipeline's heartbeat and completion are answered from the commit.
    assert await store.heartbeat("k", claim.fence)
    assert await store.complete("k", claim.fence, result)
    again = await store.claim("k", FP)
    assert again.outcome is Outcome.DUPLICATE
    assert await store.unsent() == 2


async def test_a_claim_taken_over_before_the_commit_commits_nothing(
    make_store: StoreFactory, db: AsyncConnection[Any], business_table: str
) -> None:
    store = await tx_store(make_store)
    stale = await store.claim("k", FP)
    assert await store.release("k", stale.fence)
    fresh = await store.claim("k", FP)  # another worker owns the key now
    with pytest.raises(FencedOut):
        await store.run_unit("k", stale.fence, order(business_table, "k", stale.fence))
    assert await count(db, business_table) == 0
    assert await store.unsent() == 0
    record = await store.get("k")
    assert record is not None
    assert (record.status, record.fence) == (Status.IN_PROGRESS, fresh.fence)
    assert not await store.complete("k", stale.fence, None)


async def test_a_failing_handler_commits_nothing(
    make_store: StoreFactory, db: AsyncConnection[Any], business_table: str
) -> None:
    store = await tx_store(make_store)
    claim = await store.claim("k", FP)
    written = order(business_table, "k", claim.fence)

    async def fails(conn: AsyncConnection[Any], outbox: Outbox) -> JSON:
        await written(conn, outbox)
        raise RuntimeError("after the writes")

    with pytest.raises(RuntimeError):
        await store.run_unit("k", claim.fence, fails)
    assert await count(db, business_table) == 0
    assert await store.unsent() == 0
    assert await store.release("k", claim.fence)  # still ours, still in progress


async def test_a_result_that_is_not_json_commits_nothing(
    make_store: StoreFactory, db: AsyncConnection[Any], business_table: str
) -> None:
    store = await tx_store(make_store)
    claim = await store.claim("k", FP)
    written = order(business_table, "k", claim.fence)

    async def returns_garbage(conn: AsyncConnection[Any], outbox: Outbox) -> JSON:
        await written(conn, outbox)
        return {"when": object()}

    with pytest.raises(TypeError):
        await store.run_unit("k", claim.fence, returns_garbage)
    assert await count(db, business_table) == 0


async def lock_row(db: AsyncConnection[Any], store: TransactionalStore, key: str) -> None:
    """Lock the key's row in ``db``'s open transaction, as a committing unit would."""
    table = sql.Identifier(store._table)
    await db.execute(
        sql.SQL("SELECT 1 FROM {} WHERE key = %s FOR UPDATE").format(table),
        (store.config.namespaced(key),),
    )


@pytest.mark.parametrize("state", ["released", "lease-expired"])
async def test_a_claim_never_waits_for_a_locked_row(
    make_store: StoreFactory,
    make_settings: SettingsFactory,
    db: AsyncConnection[Any],
    state: str,
    keys_table: str,
) -> None:
    store = await tx_store(make_store, lock_ttl=0.2)
    first = await store.claim("k", FP)
    if state == "released":
        assert await store.release("k", first.fence)
    else:
        await asyncio.sleep(0.3)
    # Same keys, ordinary mode.
    plain = await open_store(make_settings(lock_ttl=0.2, postgres_table=keys_table))
    try:
        async with db.transaction():
            await lock_row(db, store, "k")
            started = time.monotonic()
            claim = await store.claim("k", FP)
            waited = time.monotonic() - started
            # The ordinary store's claim queues behind the lock instead.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(plain.claim("k", FP), 1.0)
        assert claim.outcome is Outcome.IN_PROGRESS
        assert waited < 0.5, f"claim waited {waited:.2f}s for the row lock"
        assert claim.record.fence == first.fence  # nothing written
        after = await store.claim("k", FP)  # the lock is gone: claimable again
        assert after.outcome is Outcome.CLAIMED
        assert after.fence == first.fence + 1
    finally:
        await plain.close()


async def test_a_locked_completed_row_is_a_duplicate(
    make_store: StoreFactory, db: AsyncConnection[Any]
) -> None:
    store = await tx_store(make_store)
    claim = await store.claim("k", FP)
    assert await store.complete("k", claim.fence, {"done": True})
    async with db.transaction():
        await lock_row(db, store, "k")
        duplicate = await store.claim("k", FP)
    assert duplicate.outcome is Outcome.DUPLICATE
    assert duplicate.record.result == {"done": True}


async def test_a_locked_row_never_stalls_a_heartbeat_for_long(
    make_store: StoreFactory, db: AsyncConnection[Any]
) -> None:
    store = await tx_store(make_store)
    claim = await store.claim("k", FP)
    async with db.transaction():
        await lock_row(db, store, "k")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):  # the heartbeat loop tries again later
            await store.heartbeat("k", claim.fence)
        assert time.monotonic() - started < 0.5
    assert await store.heartbeat("k", claim.fence)


async def test_a_connection_lost_in_the_unit_is_an_outage(
    make_store: StoreFactory, db: AsyncConnection[Any], business_table: str
) -> None:
    store = await tx_store(make_store)
    claim = await store.claim("k", FP)
    written = order(business_table, "k", claim.fence)

    async def connection_dies(conn: AsyncConnection[Any], outbox: Outbox) -> JSON:
        await written(conn, outbox)
        await db.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        return await written(conn, outbox)

    with pytest.raises(StoreUnavailable) as info:
        await store.run_unit("k", claim.fence, connection_dies)
    assert isinstance(info.value.__cause__, psycopg.OperationalError)
    assert await count(db, business_table) == 0
    # The pool dropped the dead connection; the next unit gets a live one.
    assert await store.run_unit("k", claim.fence, order(business_table, "k", claim.fence))


async def test_purge_deletes_only_messages_sent_before_retention(
    make_store: StoreFactory, db: AsyncConnection[Any], business_table: str, outbox_table: str
) -> None:
    store = await tx_store(make_store, retention=60.0)
    claim = await store.claim("k", FP)
    await store.run_unit("k", claim.fence, order(business_table, "k", claim.fence, 5))
    ids = [r[0] for r in await rows(db, "SELECT id FROM {} ORDER BY id", outbox_table)]
    old, recent = ids[:2], ids[2:4]  # ids[4] stays unsent
    table = sql.Identifier(outbox_table)
    stamp = sql.SQL("UPDATE {} SET sent_at = now() - make_interval(secs => %s) WHERE id = ANY(%s)")
    await db.execute(stamp.format(table), (120, old))
    await db.execute(stamp.format(table), (30, recent))
    assert await store.purge_outbox(limit=1) == 1  # bounded batches
    assert await store.purge_outbox() == 1
    assert await store.purge_outbox() == 0
    left = [r[0] for r in await rows(db, "SELECT id FROM {} ORDER BY id", outbox_table)]
    assert left == ids[2:]
    assert await store.unsent() == 1


async def test_migrate_creates_the_outbox_and_its_partial_indexes(
    make_store: StoreFactory, db: AsyncConnection[Any], outbox_table: str
) -> None:
    store = await tx_store(make_store)
    await store.check_schema()
    assert await store.migrate() == []  # twice is fine
    found = await db.execute(
        "SELECT indexdef FROM pg_indexes WHERE tablename = %s ORDER BY indexname", (outbox_table,)
    )
    definitions = [r[0] for r in await found.fetchall()]
    assert any("WHERE (sent_at IS NULL)" in d for d in definitions), definitions
    assert any("(sent_at) WHERE (sent_at IS NOT NULL)" in d for d in definitions), definitions


def test_the_schema_file_is_what_migrate_runs() -> None:
    text = (Path(__file__).resolve().parents[2] / "deploy" / "postgres-outbox.sql").read_text()
    rendered = ";".join(s.as_string() for s in outbox_schema("semel_outbox"))
    assert statements(text) == statements(rendered)

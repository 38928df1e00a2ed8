"""SQLite store specifics: immediate transactions, WAL, and what counts as an outage."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import orjson
import pytest

import semel.stores.sqlite.store
from semel.stores.base import Claim, ClaimRequest, Completion, Outcome, Status
from semel.stores.errors import StoreUnavailable
from semel.stores.sqlite.store import SqliteStore, on_thread
from tests.conftest import SettingsFactory, StoreFactory, open_store
from tests.stores.race import decided

FP = "f" * 64


@pytest.fixture
def backend() -> str:
    return "sqlite"


async def traced(store: SqliteStore, sent: list[str]) -> None:
    await store._run(lambda conn: conn.set_trace_callback(sent.append))


async def test_claim_is_one_upsert_in_an_immediate_transaction(make_store: StoreFactory) -> None:
    store = cast(SqliteStore, await make_store())
    sent: list[str] = []
    await traced(store, sent)

    first = await store.claim("k", FP)
    assert [s.split()[0] for s in sent] == ["BEGIN", "INSERT", "COMMIT"]
    assert sent[0] == "BEGIN IMMEDIATE"
    assert "ON CONFLICT" in sent[1]
    assert "RETURNING" in sent[1]

    sent.clear()
    refused = await store.claim("k", FP)
    assert refused.outcome is Outcome.IN_PROGRESS
    # The read of the row it hit shares the upsert's transaction.
    assert [s.split()[0] for s in sent] == ["BEGIN", "INSERT", "SELECT", "COMMIT"]
    assert refused.fence == first.fence


async def test_database_is_in_wal_mode(make_store: StoreFactory) -> None:
    store = cast(SqliteStore, await make_store())
    mode = await store._run(lambda conn: conn.execute("PRAGMA journal_mode").fetchone())
    assert mode == ("wal",)


async def test_locked_database_is_unavailable(
    make_settings: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(semel.stores.sqlite.store, "BUSY_TIMEOUT", 0.2)
    settings = make_settings()
    store = await open_store(settings)
    try:
        await store.migrate()
        holder = sqlite3.connect(settings.sqlite_path, isolation_level=None)
        try:
            holder.execute("BEGIN EXCLUSIVE")
            with pytest.raises(StoreUnavailable) as info:
                await store.claim("k", FP)
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        finally:
            holder.close()
        # The lock is gone, and so is the outage.
        assert (await store.claim("k", FP)).outcome is Outcome.CLAIMED
    finally:
        await store.close()


async def test_opening_creates_the_table(make_settings: SettingsFactory) -> None:
    store = await open_store(make_settings())
    try:
        assert await store.get("k") is None
    finally:
        await store.close()


async def test_stores_sharing_a_file_see_each_other(make_settings: SettingsFactory) -> None:
    settings = make_settings()
    one, two = await open_store(settings), await open_store(settings)
    try:
        await one.migrate()
        claim = await one.claim("k", FP)
        assert (await two.claim("k", FP)).outcome is Outcome.IN_PROGRESS
        assert await one.complete("k", claim.fence, [1, 2])
        duplicate = await two.claim("k", FP)
        assert (duplicate.outcome, duplicate.record.result) == (Outcome.DUPLICATE, [1, 2])
    finally:
        await one.close()
        await two.close()


def completion(store: SqliteStore, claim: Claim, result: object) -> Completion:
    return Completion(claim.record.key, claim.fence, store.encode_result(result))


async def test_a_batch_is_one_transaction_of_one_claim_statement(make_store: StoreFactory) -> None:
    store = cast(SqliteStore, await make_store())
    held = await store.claim("held", FP)
    sent: list[str] = []
    await traced(store, sent)

    claims = await store.claim_many([ClaimRequest(k, FP) for k in ("a", "b", "held")])
    assert [c.outcome for c in claims] == [Outcome.CLAIMED, Outcome.CLAIMED, Outcome.IN_PROGRESS]
    assert claims[2].fence == held.fence
    # One commit, so one fsync, for the batch; the refused key's read shares it.
    assert [s.split()[0] for s in sent] == ["BEGIN", "INSERT", "SELECT", "COMMIT"]

    sent.clear()
    written = await store.complete_many([completion(store, c, c.record.key) for c in claims[:2]])
    assert written == [True, True]
    assert [s.split()[0] for s in sent] == ["BEGIN", "UPDATE", "UPDATE", "COMMIT"]


async def test_an_unreadable_row_fails_the_whole_batch_and_writes_nothing(
    make_store: StoreFactory,
) -> None:
    store = cast(SqliteStore, await make_store())
    done = await store.claim("done", FP)
    assert await store.complete("done", done.fence, [1])
    key = store.config.namespaced("done")
    await store._run(
        lambda conn: conn.execute("UPDATE semel_keys SET result = '{' WHERE key = ?", (key,))
    )
    with pytest.raises(orjson.JSONDecodeError):
        await store.claim_many([ClaimRequest("fresh", FP), ClaimRequest("done", FP)])
    # "fresh" was claimed before the bad row was read: the rollback took it back.
    assert await store.get("fresh") is None


async def test_a_failed_completion_batch_completes_none_of_its_keys(
    make_store: StoreFactory,
) -> None:
    store = cast(SqliteStore, await make_store())
    one, two = await store.claim_many([ClaimRequest("one", FP), ClaimRequest("two", FP)])
    # Not what encode_result makes: it fails on the second UPDATE, after the first ran.
    broken = Completion("two", two.fence, b"\xff")
    with pytest.raises(UnicodeDecodeError):
        await store.complete_many([completion(store, one, 1), broken])
    record = await store.get("one")
    assert record is not None
    assert (record.status, record.result) == (Status.IN_PROGRESS, None)
    written = await store.complete_many([completion(store, one, 1), completion(store, two, 2)])
    assert written == [True, True]


async def test_a_locked_database_fails_the_whole_batch(
    make_settings: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(semel.stores.sqlite.store, "BUSY_TIMEOUT", 0.2)
    settings = make_settings()
    store = await open_store(settings)
    try:
        claims = decided(await store.claim_many([ClaimRequest("a", FP), ClaimRequest("b", FP)]))
        holder = sqlite3.connect(settings.sqlite_path, isolation_level=None)
        try:
            holder.execute("BEGIN EXCLUSIVE")
            with pytest.raises(StoreUnavailable):
                await store.claim_many([ClaimRequest("c", FP), ClaimRequest("d", FP)])
            with pytest.raises(StoreUnavailable):
                await store.complete_many([Completion(c.record.key, c.fence, b"1") for c in claims])
        finally:
            holder.close()
        assert [await store.get(k) for k in ("c", "d")] == [None, None]
        assert await store.complete_many([Completion(c.record.key, c.fence, b"1") for c in claims])
    finally:
        await store.close()


async def test_results_are_still_stored_as_text(make_store: StoreFactory) -> None:
    # Databases written before batches existed hold TEXT results, and are read alike.
    store = cast(SqliteStore, await make_store())
    claim = await store.claim("k", FP)
    assert await store.complete_many([completion(store, claim, {"a": [1, 2.5]})]) == [True]
    key = store.config.namespaced("k")
    stored = await store._run(
        lambda conn: conn.execute(
            "SELECT typeof(result), result FROM semel_keys WHERE key = ?", (key,)
        ).fetchone()
    )
    assert stored == ("text", '{"a":[1,2.5]}')


async def test_a_nul_in_a_key_is_refused_not_truncated(make_store: StoreFactory) -> None:
    store = await make_store()
    with pytest.raises(ValueError, match="NUL"):
        await store.claim_many([ClaimRequest("a", FP), ClaimRequest("a\0b", FP)])
    with pytest.raises(ValueError, match="NUL"):
        await store.claim("a\0b", FP)
    assert await store.get("a") is None


async def test_a_call_cancelled_before_it_runs_never_runs() -> None:
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-store-thread")
    release = threading.Event()
    ran: list[str] = []
    try:
        first = asyncio.ensure_future(on_thread(thread, lambda _: release.wait(10), None))
        second = asyncio.ensure_future(on_thread(thread, ran.append, "second"))
        await asyncio.sleep(0)  # both handed to the thread, the first one running
        second.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await second  # its cancellation has reached the thread's queue now
        release.set()
        assert await first
        await on_thread(thread, ran.append, "third")
        assert ran == ["third"]
    finally:
        release.set()
        thread.shutdown(wait=False)
    with pytest.raises(RuntimeError):
        await on_thread(thread, ran.append, "after stop")

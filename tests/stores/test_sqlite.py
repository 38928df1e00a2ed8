"""SQLite store specifics: immediate transactions, WAL, and what counts as an outage."""

from __future__ import annotations

import sqlite3
from typing import cast

import pytest

import stores.sqlite
from stores.base import Outcome
from stores.errors import StoreUnavailable
from stores.sqlite import SqliteStore
from tests.conftest import SettingsFactory, StoreFactory, open_store

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
    monkeypatch.setattr(stores.sqlite, "BUSY_TIMEOUT", 0.2)
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


async def test_missing_table_is_a_bug_not_an_outage(make_settings: SettingsFactory) -> None:
    settings = make_settings()
    store = await open_store(settings)
    with sqlite3.connect(settings.sqlite_path) as conn:
        conn.execute(f'DROP TABLE "{settings.postgres_table}"')
    try:
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await store.claim("k", FP)
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

"""PostgreSQL store specifics: one statement per claim, the schema file, safe errors."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from semel.stores.errors import StoreUnavailable
from semel.stores.postgres.sql import schema
from semel.stores.postgres.store import PostgresStore, pool_size
from tests.conftest import SettingsFactory, StoreFactory, open_store

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "deploy" / "postgres-schema.sql"
FP = "f" * 64


@pytest.fixture
def backend() -> str:
    return "postgres"


def statements(text: str) -> list[str]:
    """SQL statements without comments, whitespace-normalised, for comparison."""
    code = re.sub(r"--[^\n]*", "", text)
    return [" ".join(s.split()) for s in code.split(";") if s.strip()]


def test_schema_file_is_what_migrate_runs() -> None:
    rendered = ";".join(s.as_string() for s in schema("semel_keys"))
    assert statements(SCHEMA_FILE.read_text()) == statements(rendered)


async def test_schema_file_creates_a_table_the_store_uses(
    make_settings: SettingsFactory, postgres_server: str
) -> None:
    table = "semel_schema_file_check"
    text = SCHEMA_FILE.read_text().replace("semel_keys", table)
    async with await psycopg.AsyncConnection.connect(postgres_server, autocommit=True) as conn:
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
        for statement in statements(text):
            await conn.execute(statement.encode())
        try:
            store = await open_store(make_settings(postgres_table=table))
            try:
                assert await store.migrate() == []  # nothing left to create
                claim = await store.claim("k", FP)
                assert await store.complete("k", claim.fence, {"ok": True})
            finally:
                await store.close()
        finally:
            await conn.execute(f"DROP TABLE {table}")


def statements_sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The text of every statement the stores execute from now on."""
    sent: list[str] = []
    execute = psycopg.AsyncCursor.execute

    async def counting(self: psycopg.AsyncCursor[Any], query: Any, *args: Any, **kw: Any) -> Any:
        sent.append(query.as_string(self) if hasattr(query, "as_string") else str(query))
        return await execute(self, query, *args, **kw)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", counting)
    return sent


async def test_claim_is_one_statement_unless_refused(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await make_store()
    sent = statements_sent(monkeypatch)

    first = await store.claim("k", FP)
    assert len(sent) == 1
    assert sent[0].lstrip().startswith("INSERT")
    assert "ON CONFLICT" in sent[0]
    assert await store.release("k", first.fence)
    sent.clear()
    await store.claim("k", FP)  # takeover: still the one upsert
    assert len(sent) == 1
    sent.clear()
    await store.claim("k", FP)  # refused: the upsert, then one read of the row it hit
    assert len(sent) == 2
    assert sent[1].lstrip().startswith("SELECT")


async def test_store_down_message_has_no_password(make_settings: SettingsFactory) -> None:
    settings = make_settings(postgres_dsn="postgresql://semel:s3cr3t-pw@127.0.0.1:1/test")
    with pytest.raises(StoreUnavailable) as info:
        await open_store(settings)
    assert "s3cr3t-pw" not in str(info.value)
    assert isinstance(info.value.__cause__, psycopg.OperationalError)


async def test_unreachable_after_open_is_unavailable(
    make_store: StoreFactory, postgres_server: str
) -> None:
    store = cast(PostgresStore, await make_store())
    async with store._pool.connection() as conn:
        pid = conn.info.backend_pid
    async with await psycopg.AsyncConnection.connect(postgres_server) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    # The pool hands out the killed connection; the store reports an outage, not a bug.
    with pytest.raises(StoreUnavailable):
        await store.ping()
    await store.ping()  # the broken connection was dropped; a fresh one answers


def test_pool_size_follows_prefetch_within_bounds() -> None:
    assert [pool_size(n) for n in (1, 2, 5, 8, 256)] == [2, 2, 5, 8, 8]
    assert pool_size(256, (2, 32)) == 32


async def test_connections_carry_deadlines_tied_to_the_lease(make_store: StoreFactory) -> None:
    # A third of a 24 s lease: the server ends a statement running longer, and
    # the kernel drops a connection whose bytes go unacknowledged that long.
    store = cast(PostgresStore, await make_store(lock_ttl=24.0, retention=3600))
    async with store._pool.connection() as conn:
        cur = await conn.execute("SHOW statement_timeout")
        assert await cur.fetchone() == ("8s",)
        params = conn.info.get_parameters()
    assert params["tcp_user_timeout"] == "8000"
    assert params["keepalives"] == "1"
    assert params["keepalives_idle"] == "8"


async def test_client_side_bounds_never_go_under_their_floor(make_store: StoreFactory) -> None:
    store = cast(PostgresStore, await make_store(lock_ttl=1.5))
    async with store._pool.connection() as conn:
        cur = await conn.execute("SHOW statement_timeout")
        assert await cur.fetchone() == ("5s",)


async def test_a_dsn_that_names_its_own_timeouts_keeps_them(
    make_settings: SettingsFactory, postgres_server: str
) -> None:
    dsn = f"{postgres_server}?options=-c%20statement_timeout%3D7000&tcp_user_timeout=9000"
    store = cast(PostgresStore, await open_store(make_settings(postgres_dsn=dsn, lock_ttl=6.0)))
    try:
        async with store._pool.connection() as conn:
            cur = await conn.execute("SHOW statement_timeout")
            assert await cur.fetchone() == ("7s",)
            assert conn.info.get_parameters()["tcp_user_timeout"] == "9000"
    finally:
        await store.close()


async def test_migrations_at_once_take_turns(
    make_settings: SettingsFactory, postgres_server: str
) -> None:
    """Workers starting together on a new database each run ``migrate``; without the
    advisory lock PostgreSQL answered most of them with a unique violation on its
    catalog (15 of 20 here)."""
    table = "semel_migrate_race"
    async with await psycopg.AsyncConnection.connect(postgres_server, autocommit=True) as conn:
        for _ in range(3):
            await conn.execute(f"DROP TABLE IF EXISTS {table}")
            stores = [await open_store(make_settings(postgres_table=table)) for _ in range(4)]
            try:
                answers = await asyncio.gather(
                    *(s.migrate() for s in stores), return_exceptions=True
                )
            finally:
                for store in stores:
                    await store.close()
            assert answers == [[]] * len(stores)
        await conn.execute(f"DROP TABLE {table}")

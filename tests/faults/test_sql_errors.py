"""What the SQL stores make of their server's failures, each produced for real.

A condition that passes (a read-only standby, a lock or statement timeout, a
role out of connections, a locked or full database) is ``StoreUnavailable``;
a store that is reachable but not set up for semel (privileges revoked, a
dropped table, a read-only database file) is ``StoreMisconfigured``. Nothing
raw escapes (``semel.stores.postgres.errors``, ``semel.stores.sqlite.errors``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from psycopg import AsyncConnection, sql
from psycopg.conninfo import make_conninfo

import semel.stores.sqlite.store
from semel.stores import postgres
from semel.stores.base import ClaimRequest, Completion, Outcome, Store, StoreConfig
from semel.stores.errors import StoreMisconfigured, StoreUnavailable
from semel.stores.postgres import transactional as postgres_tx
from semel.stores.postgres.outbox import Outbox
from semel.stores.postgres.store import PostgresStore
from semel.stores.postgres.transactional import TransactionalStore

pytestmark = pytest.mark.timeout(60)

FP = "f" * 64
PgStores = Callable[..., Awaitable[PostgresStore]]


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def named(template: str, *names: str) -> sql.Composed:
    return sql.SQL(template).format(*map(sql.Identifier, names))


# -- PostgreSQL ------------------------------------------------------------------------


@pytest.fixture
async def admin(postgres_server: str) -> AsyncIterator[AsyncConnection[Any]]:
    async with await AsyncConnection.connect(postgres_server, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def table(admin: AsyncConnection[Any]) -> AsyncIterator[str]:
    name = unique("semel_sqlerr")
    yield name
    await admin.execute(named("DROP TABLE IF EXISTS {}", name))


@pytest.fixture
async def role(admin: AsyncConnection[Any], table: str) -> AsyncIterator[str]:
    """A throwaway login role; its settings, grants and sessions go with it."""
    name = unique("semel_sqlerr_role")
    await admin.execute(named("CREATE ROLE {} LOGIN", name))
    yield name
    stop = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s"
    await admin.execute(stop, (name,))
    await admin.execute(named("DROP OWNED BY {}", name))
    await admin.execute(named("DROP ROLE {}", name))


@pytest.fixture
async def pg_stores(postgres_server: str, table: str, role: str) -> AsyncIterator[PgStores]:
    """Open stores on ``table``, all with one key prefix: as the superuser, or as ``role``."""
    config = StoreConfig(key_prefix=unique("t"))
    opened: list[Store] = []

    async def factory(as_role: str | None = None) -> PostgresStore:
        dsn = postgres_server if as_role is None else make_conninfo(postgres_server, user=as_role)
        opened.append(await postgres.open_store(dsn=dsn, table=table, connections=2, config=config))
        return cast(PostgresStore, opened[-1])

    yield factory
    for store in opened:
        await store.close()


async def owned_table(pg_stores: PgStores, admin: AsyncConnection[Any], role: str) -> PostgresStore:
    """The superuser's store, its table migrated, ``role`` granted what the store needs."""
    owner = await pg_stores()
    await owner.migrate()
    grant = "GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}"
    await admin.execute(named(grant, owner._table, role))
    return owner


async def test_postgres_a_read_only_server_is_unavailable(
    pg_stores: PgStores, admin: AsyncConnection[Any], role: str
) -> None:
    owner = await owned_table(pg_stores, admin, role)
    held = await owner.claim("held", FP)
    # Every session of the role is read-only, as every session is on a standby.
    await admin.execute(named("ALTER ROLE {} SET default_transaction_read_only = on", role))
    standby = await pg_stores(role)
    with pytest.raises(StoreUnavailable) as info:
        await standby.claim("k", FP)
    assert isinstance(info.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)
    with pytest.raises(StoreUnavailable):
        await standby.complete_many([Completion("held", held.fence, b"1")])
    record = await standby.get("held")  # reads still answer
    assert record is not None
    assert record.fence == held.fence


@pytest.mark.parametrize(
    ("setting", "cause"),
    [
        ("lock_timeout", psycopg.errors.LockNotAvailable),
        ("statement_timeout", psycopg.errors.QueryCanceled),
    ],
)
async def test_postgres_a_timeout_on_a_locked_row_is_unavailable(
    pg_stores: PgStores,
    admin: AsyncConnection[Any],
    role: str,
    postgres_server: str,
    setting: str,
    cause: type[Exception],
) -> None:
    owner = await owned_table(pg_stores, admin, role)
    claim = await owner.claim("k", FP)
    await admin.execute(named("ALTER ROLE {} SET {} = '100ms'", role, setting))
    waiting = await pg_stores(role)
    locked = named("SELECT 1 FROM {} WHERE key = %s FOR UPDATE", owner._table)
    async with await AsyncConnection.connect(postgres_server) as holder, holder.transaction():
        await holder.execute(locked, (owner.config.namespaced("k"),))
        with pytest.raises(StoreUnavailable) as info:
            await waiting.claim("k", FP)
        assert isinstance(info.value.__cause__, cause)
        with pytest.raises(StoreUnavailable):
            await waiting.heartbeat("k", claim.fence)
    # The lock is gone, and so is the outage.
    assert (await waiting.claim("k", FP)).outcome is Outcome.IN_PROGRESS
    assert await waiting.heartbeat("k", claim.fence)


async def test_postgres_a_role_without_privileges_is_misconfigured(
    pg_stores: PgStores, admin: AsyncConnection[Any], role: str, table: str
) -> None:
    await owned_table(pg_stores, admin, role)
    store = await pg_stores(role)
    assert (await store.claim("k", FP)).outcome is Outcome.CLAIMED
    await admin.execute(named("REVOKE ALL ON {} FROM {}", table, role))
    with pytest.raises(StoreMisconfigured) as info:
        await store.claim("other", FP)
    assert isinstance(info.value.__cause__, psycopg.errors.InsufficientPrivilege)
    with pytest.raises(StoreMisconfigured):
        await store.get("k")
    await store.ping()  # the server itself answers


async def test_postgres_a_table_dropped_at_run_time_is_misconfigured(
    pg_stores: PgStores, admin: AsyncConnection[Any], table: str
) -> None:
    store = await pg_stores()
    await store.migrate()
    for i in range(6):  # psycopg prepares a statement sent five times: still no bug
        await store.claim(f"k{i}", FP)
    await admin.execute(named("DROP TABLE {}", table))
    with pytest.raises(StoreMisconfigured) as info:
        await store.claim("k", FP)
    assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)
    with pytest.raises(StoreMisconfigured):
        await store.complete("k0", 1, None)
    await store.migrate()  # what the operator is told to do
    assert (await store.claim("k0", FP)).outcome is Outcome.CLAIMED


async def test_postgres_transactional_dropped_tables_are_misconfigured(
    postgres_server: str, admin: AsyncConnection[Any], table: str
) -> None:
    outbox = unique("semel_sqlerr_outbox")
    store = await postgres_tx.open_store(
        dsn=postgres_server,
        table=table,
        outbox_table=outbox,
        connections=2,
        handler_timeout=5.0,
        config=StoreConfig(key_prefix=unique("t")),
    )
    assert isinstance(store, TransactionalStore)

    async def stages(conn: AsyncConnection[Any], box: Outbox) -> str:
        box.stage("orders", "order.recorded", {"n": 1})
        return "done"

    async def queries_a_missing_table(conn: AsyncConnection[Any], box: Outbox) -> str:
        await conn.execute(named("SELECT * FROM {}", unique("no_such_table")))
        return "never"

    try:
        await store.migrate()
        claim = await store.claim("k", FP)
        # The handler's own error stays the handler's.
        with pytest.raises(psycopg.errors.UndefinedTable):
            await store.run_unit("k", claim.fence, queries_a_missing_table)
        await admin.execute(named("DROP TABLE {}", outbox))
        with pytest.raises(StoreMisconfigured) as info:
            await store.run_unit("k", claim.fence, stages)
        assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)
        await admin.execute(named("DROP TABLE {}", table))
        with pytest.raises(StoreMisconfigured):
            await store.claim("other", FP)
    finally:
        await store.close()
        await admin.execute(named("DROP TABLE IF EXISTS {}", outbox))


async def test_postgres_a_role_out_of_connections_is_unavailable_at_open(
    postgres_server: str, admin: AsyncConnection[Any], role: str, table: str
) -> None:
    await admin.execute(named("ALTER ROLE {} CONNECTION LIMIT 0", role))
    with pytest.raises(StoreUnavailable, match="too many connections") as info:
        await postgres.open_store(
            dsn=make_conninfo(postgres_server, user=role),
            table=table,
            connections=2,
            config=StoreConfig(),
        )
    assert isinstance(info.value.__cause__, psycopg.OperationalError)


# -- SQLite ----------------------------------------------------------------------------


async def sqlite_store(path: Path) -> Store:
    return await semel.stores.sqlite.open_store(
        path=str(path), table="semel_keys", config=StoreConfig()
    )


@contextlib.contextmanager
def mounted(target: Path, *options: str, read_only: bool = False) -> Iterator[Path]:
    """``mount options... target`` for the block, remounted ``read_only`` (a bind
    mount); skipped where this cannot mount."""
    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root")
    target.mkdir(exist_ok=True)
    done = subprocess.run(["mount", *options, str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(target)], check=True)
        yield target
    finally:
        if subprocess.run(["umount", str(target)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(target)], check=False)


async def test_sqlite_a_database_locked_past_the_busy_timeout_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(semel.stores.sqlite.store, "BUSY_TIMEOUT", 0.2)
    path = tmp_path / "semel.db"
    store = await sqlite_store(path)
    try:
        claim = await store.claim("k", FP)
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            holder.execute("BEGIN EXCLUSIVE")
            with pytest.raises(StoreUnavailable, match="database is locked"):
                await store.claim("other", FP)
            with pytest.raises(StoreUnavailable, match="database is locked"):
                await store.complete("k", claim.fence, 1)
        finally:
            holder.close()
        assert await store.complete("k", claim.fence, 1)
    finally:
        await store.close()


async def test_sqlite_a_full_disk_is_unavailable(tmp_path: Path) -> None:
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=512k", "tmpfs") as small:
        store = await sqlite_store(small / "semel.db")
        try:
            claim = await store.claim("k", FP)
            filler = small / "filler"
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
            try:
                with contextlib.suppress(OSError):
                    while True:  # until ENOSPC
                        os.write(fd, b"\0" * 4096)
            finally:
                os.close(fd)
            with pytest.raises(StoreUnavailable, match="database or disk is full") as info:
                await store.claim_many([ClaimRequest(f"n{i}", FP) for i in range(50)])
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
            filler.unlink()
            assert (await store.claim("n0", FP)).outcome is Outcome.CLAIMED
            assert await store.complete("k", claim.fence, [1])
        finally:
            await store.close()


async def test_sqlite_a_read_only_database_is_misconfigured(tmp_path: Path) -> None:
    source = tmp_path / "data"
    source.mkdir()
    with mounted(tmp_path / "read-only", "--bind", str(source), read_only=True) as view:
        # A database written by another tool (not yet in WAL mode), on a read-only volume.
        with contextlib.closing(sqlite3.connect(source / "old.db")) as old, old:
            old.execute("CREATE TABLE notes (text TEXT)")
        with pytest.raises(StoreMisconfigured, match="readonly database") as opening:
            await sqlite_store(view / "old.db")
        assert isinstance(opening.value.__cause__, sqlite3.OperationalError)
        # The live database, seen read-only by a second store while the first one writes.
        writer = await sqlite_store(source / "semel.db")
        try:
            claim = await writer.claim("k", FP)
            reader = await sqlite_store(view / "semel.db")
            try:
                with pytest.raises(StoreMisconfigured, match="readonly database"):
                    await reader.claim("other", FP)
                with pytest.raises(StoreMisconfigured):
                    await reader.complete("k", claim.fence, 1)
                assert await reader.get("k") is not None  # reads still answer
            finally:
                await reader.close()
        finally:
            await writer.close()


async def test_sqlite_a_dropped_table_is_misconfigured(tmp_path: Path) -> None:
    path = tmp_path / "semel.db"
    store = await sqlite_store(path)
    try:
        claim = await store.claim("k", FP)
        with sqlite3.connect(path) as conn:
            conn.execute('DROP TABLE "semel_keys"')
        with pytest.raises(StoreMisconfigured, match="no such table") as info:
            await store.claim("k", FP)
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        with pytest.raises(StoreMisconfigured):
            await store.complete("k", claim.fence, 1)
        await store.migrate()
        assert (await store.claim("k", FP)).outcome is Outcome.CLAIMED
    finally:
        await store.close()

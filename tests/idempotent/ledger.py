"""A ledger of effects in the store's own server: a Redis list or a PostgreSQL table.

Every process of a proof appends to it what it did, with its fence and pid,
so the count of effects is read from a real server, not from any process.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson
import psycopg
import redis.asyncio
from psycopg import sql

from semel.settings import Settings

Entry = dict[str, Any]


class Ledger(Protocol):
    async def append(self, entry: Entry) -> None: ...

    async def entries(self) -> list[Entry]: ...

    async def close(self) -> None: ...


class RedisLedger:
    def __init__(self, url: str, name: str) -> None:
        self._client = redis.asyncio.Redis.from_url(url)
        self._name = name

    async def append(self, entry: Entry) -> None:
        await self._client.rpush(self._name, orjson.dumps(entry))

    async def entries(self) -> list[Entry]:
        return [orjson.loads(raw) for raw in await self._client.lrange(self._name, 0, -1)]

    async def drop(self) -> None:
        await self._client.delete(self._name)

    async def close(self) -> None:
        await self._client.aclose()


class PostgresLedger:
    def __init__(self, connection: psycopg.AsyncConnection[Any], name: str) -> None:
        self._connection = connection
        self._table = sql.Identifier(name)

    async def create(self) -> None:
        await self._connection.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (n serial PRIMARY KEY, entry jsonb)").format(
                self._table
            )
        )

    async def append(self, entry: Entry) -> None:
        statement = sql.SQL("INSERT INTO {} (entry) VALUES (%s::jsonb)").format(self._table)
        await self._connection.execute(statement, (orjson.dumps(entry).decode(),))

    async def entries(self) -> list[Entry]:
        statement = sql.SQL("SELECT entry FROM {} ORDER BY n").format(self._table)
        cursor = await self._connection.execute(statement)
        return [row[0] for row in await cursor.fetchall()]

    async def drop(self) -> None:
        await self._connection.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._table))

    async def close(self) -> None:
        await self._connection.close()


async def open_ledger(settings: Settings) -> RedisLedger | PostgresLedger:
    """The ledger beside ``settings``' store, named after its key prefix (one per test)."""
    name = f"ledger_{settings.key_prefix}"
    if settings.store == "redis":
        return RedisLedger(settings.redis_url, name)
    connection = await psycopg.AsyncConnection.connect(settings.postgres_dsn, autocommit=True)
    ledger = PostgresLedger(connection, name)
    await ledger.create()
    return ledger

"""Fixtures of the outbox operations tests: an outbox table of its own per test,
rows written into it with SQL, and ``semel`` run in-process against it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb
from typer.testing import CliRunner

from semel.consumer.commands.app import app
from semel.settings import Settings
from semel.stores.postgres.outbox import schema
from tests.conftest import SettingsFactory, settings_env

# Never shown by any command: a test fails if it ever shows up.
BODY_MARKER = "secret-body-never-shown"


@pytest.fixture
def backend() -> str:
    return "postgres"


@pytest.fixture
def outbox_table() -> str:
    return f"t_{uuid.uuid4().hex[:10]}_outbox"


@pytest.fixture
async def db(postgres_server: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection of the test's own (autocommit)."""
    async with await psycopg.AsyncConnection.connect(postgres_server, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def outbox(db: psycopg.AsyncConnection[Any], outbox_table: str) -> AsyncIterator[Rows]:
    """The test's outbox table, made as `semel migrate` makes it, dropped after."""
    for statement in schema(outbox_table):
        await db.execute(statement)
    yield Rows(db, outbox_table)
    await db.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(outbox_table)))


@pytest.fixture
def settings(make_settings: SettingsFactory, outbox_table: str) -> Settings:
    return make_settings(outbox_table=outbox_table, outbox_stale_after=60.0)


@dataclass
class Rows:
    """Rows put straight into the outbox table, aged by moving their timestamps."""

    db: psycopg.AsyncConnection[Any]
    table: str

    async def add(
        self,
        *,
        key: str = "order-1",
        routing_key: str = "order.paid",
        exchange: str = "shop",
        age: float = 0.0,
        attempts: int = 0,
        last_error: str | None = None,
        retry_in: float = 0.0,
        sent: bool = False,
    ) -> int:
        """One row staged ``age`` seconds ago; ``retry_in`` > 0 puts it in back-off."""
        statement = sql.SQL(
            "INSERT INTO {} (message_id, key, fence, exchange, routing_key, body, content_type,"
            " headers, created_at, attempts, last_error, next_attempt_at, sent_at)"
            " VALUES (%s, %s, 0, %s, %s, %s, 'application/json', %s,"
            " now() - make_interval(secs => %s), %s, %s, now() + make_interval(secs => %s),"
            " CASE WHEN %s THEN now() END) RETURNING id"
        ).format(sql.Identifier(self.table))
        body = f'{{"card": "{BODY_MARKER}"}}'.encode()
        params = (
            uuid.uuid4(), key, exchange, routing_key, body, Jsonb({}),
            age, attempts, last_error, retry_in, sent,
        )  # fmt: skip
        cur = await self.db.execute(statement, params)
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def age(self, row_id: int, seconds: float) -> None:
        """Make a row look staged ``seconds`` ago."""
        statement = sql.SQL(
            "UPDATE {} SET created_at = now() - make_interval(secs => %s) WHERE id = %s"
        ).format(sql.Identifier(self.table))
        await self.db.execute(statement, (seconds, row_id))

    async def send(self, row_id: int) -> None:
        statement = sql.SQL("UPDATE {} SET sent_at = now() WHERE id = %s")
        await self.db.execute(statement.format(sql.Identifier(self.table)), (row_id,))


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a command did: its exit code and output."""

    code: int
    stdout: str
    stderr: str


_runner = CliRunner()


async def semel(settings: Settings, *args: str, columns: int | None = 250) -> Outcome:
    """Run ``semel`` in-process with ``settings`` as its environment, on a wide
    terminal so that no table cell is cut (``columns=None``: no COLUMNS, as when
    piped); it runs its own loop, so on a thread."""
    env: dict[str, str | None] = dict(settings_env(settings))
    env["COLUMNS"] = None if columns is None else str(columns)
    result = await asyncio.to_thread(_runner.invoke, app, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Outcome(result.exit_code, result.stdout, result.stderr)

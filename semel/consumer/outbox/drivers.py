"""Running the staging insert on whatever transaction the caller holds.

psycopg 3 connections run it directly; SQLAlchemy sessions and connections
through SQLAlchemy's own ``text()``, so any PostgreSQL driver behind them
works (psycopg, asyncpg). A library the caller never imported cannot have
made its transaction, so each is looked up in ``sys.modules`` instead of
imported: staging needs neither installed.

A staged message must exist exactly when the caller's transaction commits,
so a connection whose writes commit on their own is refused before anything
is sent: a psycopg connection in autocommit outside a ``transaction()``
block, a SQLAlchemy connection at ``isolation_level="AUTOCOMMIT"``. A
connection that is not yet in a transaction but will begin one with this
statement (psycopg's default, SQLAlchemy's autobegin) is accepted: the row
then commits with the caller's ``commit()``, or never.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

    AsyncTransaction: TypeAlias = psycopg.AsyncConnection[Any] | AsyncSession | SAAsyncConnection
    SyncTransaction: TypeAlias = psycopg.Connection[Any] | Session | SAConnection

SUPPORTED_ASYNC = "a psycopg AsyncConnection, a SQLAlchemy AsyncSession or AsyncConnection"
SUPPORTED_SYNC = "a psycopg Connection, a SQLAlchemy Session or Connection"


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement in both placeholder styles: psycopg's ``%(name)s``, SQLAlchemy's ``:name``."""

    pyformat: str
    named: str


class NotInTransaction(ValueError):
    """The connection given to stage a message would commit it on its own."""


def _module(name: str) -> Any:
    return sys.modules.get(name)


def _check_psycopg(conn: Any) -> None:
    from psycopg.pq import TransactionStatus

    status = conn.info.transaction_status
    if status == TransactionStatus.INTRANS:
        return
    if status == TransactionStatus.IDLE and not conn.autocommit:
        return  # psycopg begins the transaction with this statement
    if status == TransactionStatus.IDLE:
        raise NotInTransaction(
            "the psycopg connection is in autocommit outside a transaction: the message "
            "would be published even if your transaction rolled back; stage it inside "
            "`with conn.transaction():`"
        )
    raise NotInTransaction(f"the psycopg connection cannot take a statement now ({status.name})")


def _check_sqlalchemy(dbapi_connection: Any) -> None:
    if getattr(dbapi_connection, "autocommit", False):
        raise NotInTransaction(
            "the SQLAlchemy connection is at isolation_level AUTOCOMMIT: the message would "
            "be published even if your transaction rolled back; stage it in a session or "
            "connection that is not"
        )


async def execute(tx: AsyncTransaction, statement: Statement, params: dict[str, Any]) -> None:
    """Run ``statement`` with ``params`` in ``tx``'s transaction."""
    psycopg = _module("psycopg")
    if psycopg is not None and isinstance(tx, psycopg.AsyncConnection):
        _check_psycopg(tx)
        await tx.execute(statement.pyformat, params)
        return
    sa_async = _module("sqlalchemy.ext.asyncio")
    if sa_async is not None and isinstance(tx, sa_async.AsyncSession | sa_async.AsyncConnection):
        from sqlalchemy import text

        conn = await tx.connection() if isinstance(tx, sa_async.AsyncSession) else tx
        raw = await conn.get_raw_connection()
        _check_sqlalchemy(raw.dbapi_connection)
        await conn.execute(text(statement.named), params)
        return
    raise TypeError(f"stage() takes {SUPPORTED_ASYNC}, not {type(tx).__name__}")


def execute_sync(tx: SyncTransaction, statement: Statement, params: dict[str, Any]) -> None:
    """:func:`execute` for a blocking connection."""
    psycopg = _module("psycopg")
    if psycopg is not None and isinstance(tx, psycopg.Connection):
        _check_psycopg(tx)
        tx.execute(statement.pyformat, params)
        return
    orm, engine = _module("sqlalchemy.orm"), _module("sqlalchemy.engine")
    if orm is not None and isinstance(tx, orm.Session):
        tx = tx.connection()
    if engine is not None and isinstance(tx, engine.Connection):
        from sqlalchemy import text

        _check_sqlalchemy(tx.connection.dbapi_connection)
        tx.execute(text(statement.named), params)
        return
    raise TypeError(f"stage_sync() takes {SUPPORTED_SYNC}, not {type(tx).__name__}")

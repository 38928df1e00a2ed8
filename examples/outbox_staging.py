"""Staging a message in a transaction you already have, three ways.

Each function writes a business row and stages the message that announces it
in one PostgreSQL transaction: both exist exactly when it commits. A relay
(``semel relay``, ``semel consume`` with ``SEMEL_OUTBOX_RELAY=true``, or
``engine.relay()``) publishes the message afterwards. Run by
tests/outbox/test_examples.py on the real PostgreSQL.
"""

from __future__ import annotations

from typing import Any

from psycopg import Connection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from semel import Semel

engine = Semel()  # SEMEL_OUTBOX_TABLE, SEMEL_EXCHANGE, SEMEL_KEY_SOURCE; no start() needed


# --8<-- [start:psycopg]
async def pay_with_psycopg(pool: AsyncConnectionPool, order_id: int, total: int) -> str:
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("UPDATE orders SET paid = true WHERE id = %s", (order_id,))
        return await engine.outbox.stage(
            conn,
            {"order_id": order_id, "total": total},
            key=f"order-paid-{order_id}",
            routing_key="order.paid",
        )


# --8<-- [end:psycopg]


# --8<-- [start:sqlalchemy]
async def pay_with_sqlalchemy(session: AsyncSession, order_id: int, total: int) -> str:
    async with session.begin():  # psycopg or asyncpg underneath: both work
        await session.execute(
            text("UPDATE orders SET paid = true WHERE id = :id"), {"id": order_id}
        )
        return await engine.outbox.stage(
            session,
            {"order_id": order_id, "total": total},
            key=f"order-paid-{order_id}",
            routing_key="order.paid",
        )


# --8<-- [end:sqlalchemy]


# --8<-- [start:sync]
def pay_blocking(conn: Connection[Any], order_id: int, total: int) -> str:
    # A psycopg Connection here; a SQLAlchemy Session or Connection works the same.
    with conn.transaction():
        conn.execute("UPDATE orders SET paid = true WHERE id = %s", (order_id,))
        return engine.outbox.stage_sync(
            conn,
            {"order_id": order_id, "total": total},
            key=f"order-paid-{order_id}",
            routing_key="order.paid",
        )


# --8<-- [end:sync]

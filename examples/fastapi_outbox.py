"""An orders endpoint whose event is published if and only if its order commits.

``POST /orders`` writes the order row and stages its ``order.placed`` message
in one PostgreSQL transaction: both exist exactly when it commits, and a relay
publishes the message afterwards (under the same message id if it has to send
it again). The client's ``Idempotency-Key`` is the order's unique key: the
same request again answers 200 with the first one's message id and stages
nothing. ``"fail": true`` in the body raises after staging, so the transaction
rolls back: no order, no message, 500::

    export SEMEL_POSTGRES_DSN=postgresql://localhost/shop SEMEL_STORE=postgres
    export SEMEL_EXCHANGE=shop.events
    semel migrate                           # the outbox table
    ORDERS_RELAY=1 uvicorn examples.fastapi_outbox:app
    curl -X POST localhost:8000/orders -H 'Idempotency-Key: order-42' \\
         -H 'Content-Type: application/json' -d '{"item": "book", "amount": 1200}'

``ORDERS_RELAY=1`` runs a relay inside the web process; without it run
``semel relay`` beside the web processes (or ``SEMEL_OUTBOX_RELAY=true`` in
``semel consume``). ``ORDERS_TABLE`` names the orders table (``orders``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from psycopg import AsyncConnection, sql
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from semel import Semel

ORDERS = sql.Identifier(os.environ.get("ORDERS_TABLE", "orders"))
RELAY_HERE = os.environ.get("ORDERS_RELAY", "") not in ("", "0", "false")

SCHEMA = sql.SQL("""
CREATE TABLE IF NOT EXISTS {orders} (
    key        text PRIMARY KEY,
    message_id uuid NOT NULL,
    body       jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)""").format(orders=ORDERS)
INSERT = sql.SQL(
    "INSERT INTO {} (key, message_id, body) VALUES (%s, %s, %s) ON CONFLICT (key) DO NOTHING"
).format(ORDERS)
SELECT = sql.SQL("SELECT message_id FROM {} WHERE key = %s").format(ORDERS)

# --8<-- [start:setup]
engine = Semel()  # SEMEL_* settings: the exchange, the outbox table, the key's place
pool = AsyncConnectionPool(engine.settings.postgres_dsn, open=False)


@contextlib.asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    async with pool, contextlib.AsyncExitStack() as stack:
        async with pool.connection() as conn:
            await conn.execute(SCHEMA)
        if RELAY_HERE:  # LISTEN/NOTIFY wake-up, a periodic sweep, the purge of sent rows
            await stack.enter_async_context(engine.relay())
        yield


app = FastAPI(lifespan=lifespan)
# --8<-- [end:setup]


class Order(BaseModel):
    item: str
    amount: int  # in cents
    fail: bool = False  # raise after staging: the transaction rolls back


class Answered(Exception):
    """Leaves the transaction, rolling it back, with the answer to give."""

    def __init__(self, status: int, content: dict[str, str]) -> None:
        self.response = JSONResponse(content, status_code=status)


# --8<-- [start:endpoint]
@app.post("/orders", status_code=201)
async def place_order(order: Order, idempotency_key: Annotated[str, Header()]) -> Any:
    body = {"key": idempotency_key, "item": order.item, "amount": order.amount}
    try:
        async with pool.connection() as conn, conn.transaction():
            message_id = await engine.outbox.stage(
                conn, body, key=idempotency_key, routing_key="order.placed"
            )
            # Staged first, so the order row keeps its message id; a retry of a
            # committed order rolls its staged copy back and answers as before.
            placed = await conn.execute(INSERT, (idempotency_key, message_id, Jsonb(body)))
            if placed.rowcount == 0:
                raise Answered(200, {"message_id": await message_id_of(conn, idempotency_key)})
            if order.fail:
                raise Answered(500, {"error": "failed after staging: rolled back"})
    except Answered as answered:
        return answered.response
    return {"message_id": message_id}


# --8<-- [end:endpoint]


async def message_id_of(conn: AsyncConnection[Any], key: str) -> str:
    cursor = await conn.execute(SELECT, (key,))
    row = await cursor.fetchone()
    assert row is not None  # ON CONFLICT waited for the order's own transaction to commit
    return str(row[0])

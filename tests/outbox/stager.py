"""A process that commits staged messages, as a web service would: run by the tests as
``python -m tests.outbox.stager DSN TABLE EXCHANGE PREFIX COUNT GROUPS``.

Each transaction stages one message of group ``PREFIX-g<n>``, numbered within its
group. Transactions of one group are serialised (an advisory lock, as a service
would lock its business row), so its numbers are its causal order; every fifth
transaction rolls back on purpose, and its message must never be published. The
process prints one JSON line per committed message: ``[group, seq, message_id]``.
"""

from __future__ import annotations

import asyncio
import sys

import orjson
import psycopg
from psycopg import sql

from semel.consumer.delivery.message import KeySource
from semel.consumer.outbox.writer import OutboxWriter

ROUTING_KEY = "order.paid"


class RolledBack(Exception):
    pass


async def main(dsn: str, table: str, exchange: str, prefix: str, count: int, groups: int) -> None:
    writer = OutboxWriter(table, exchange, KeySource.parse("header:Idempotency-Key"))
    seq_of = sql.SQL("SELECT count(*) FROM {} WHERE key = %s").format(sql.Identifier(table))
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for n in range(count):
            group = f"{prefix}-g{n % groups}"
            try:
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (group,))
                    row = await (await conn.execute(seq_of, (group,))).fetchone()
                    seq = int(row[0]) + 1 if row else 1
                    message_id = await writer.stage(
                        conn,
                        {"group": group, "seq": seq},
                        key=f"{group}-{seq}-{n}",
                        routing_key=ROUTING_KEY,
                        group=group,
                    )
                    if n % 5 == 4:
                        raise RolledBack
            except RolledBack:
                continue
            print(orjson.dumps([group, seq, message_id]).decode(), flush=True)


if __name__ == "__main__":
    dsn, table, exchange, prefix, count, groups = sys.argv[1:7]
    asyncio.run(main(dsn, table, exchange, prefix, int(count), int(groups)))

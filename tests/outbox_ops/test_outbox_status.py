"""The outbox's counts and unsent rows, read on the real PostgreSQL."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
import pytest
from aiormq.exceptions import ChannelNotFoundEntity
from psycopg import sql

from semel.consumer.broker.publishing import Published
from semel.consumer.outbox.relay import refusal
from semel.stores.postgres.outbox_status import (
    SUMMARY,
    WAITING,
    OutboxMissing,
    OutboxStatus,
    Refusal,
    connecting,
    refusal_of,
    report,
    summary_reader,
)
from tests.outbox_ops.conftest import Rows

pytestmark = pytest.mark.timeout(30)

UNROUTABLE = "unroutable: no queue is bound for its routing key"
NACKED = "refused by the broker (basic.nack)"
NOT_FOUND = "exchange not found: NOT_FOUND - no exchange 'shop.v2' in vhost '/'"


async def test_each_unsent_row_says_why_it_waits_and_sent_rows_are_not_shown(
    outbox: Rows, postgres_server: str
) -> None:
    sent_before = await outbox.add(key="gone", age=500, sent=True)
    due = await outbox.add(key="a", age=300)
    unroutable = await outbox.add(key="b", age=90, attempts=3, last_error=UNROUTABLE, retry_in=60)
    nacked = await outbox.add(key="c", age=5, attempts=1, last_error=NACKED, retry_in=30)
    missing = await outbox.add(key="d", age=70, attempts=2, last_error=NOT_FOUND, retry_in=45)
    due_again = await outbox.add(key="e", age=10, attempts=1, last_error=NACKED)
    await outbox.add(key="gone", sent=True)

    seen = await report(connecting(postgres_server), outbox.table, limit=50, stale_after=60)

    assert [m.id for m in seen.waiting] == [due, unroutable, nacked, missing, due_again]
    assert sent_before not in [m.id for m in seen.waiting]
    by_id = {m.id: m for m in seen.waiting}
    assert (by_id[due].backing_off, by_id[due].refusal) == (False, None)
    assert (by_id[unroutable].backing_off, by_id[unroutable].refusal) == (True, Refusal.UNROUTABLE)
    assert (by_id[nacked].backing_off, by_id[nacked].refusal) == (True, Refusal.NACKED)
    assert (by_id[missing].backing_off, by_id[missing].refusal) == (
        True,
        Refusal.EXCHANGE_NOT_FOUND,
    )
    # Its back-off is over: due again, and what the broker said last still shows.
    assert (by_id[due_again].backing_off, by_id[due_again].refusal) == (False, Refusal.NACKED)
    assert by_id[unroutable].attempts == 3
    assert 89 <= by_id[unroutable].age <= 100
    assert 50 <= by_id[unroutable].next_attempt_in <= 60
    assert by_id[due].next_attempt_in <= 0
    assert (by_id[due].key, by_id[due].routing_key) == ("a", "order.paid")
    assert not hasattr(by_id[due], "body")

    summary = seen.summary
    assert (summary.unsent, summary.due, summary.backing_off) == (5, 2, 3)
    assert (summary.refused, summary.unroutable) == (4, 1)
    assert (summary.stale, summary.stale_after) == (3, 60)  # staged 300, 90 and 70 s ago
    assert summary.oldest_age is not None
    assert 299 <= summary.oldest_age <= 310


async def test_an_empty_outbox_counts_nothing_and_the_limit_holds(
    outbox: Rows, postgres_server: str
) -> None:
    empty = await report(connecting(postgres_server), outbox.table, limit=2, stale_after=60)
    assert empty.waiting == []
    assert (empty.summary.unsent, empty.summary.stale, empty.summary.oldest_age) == (0, 0, None)
    ids = [await outbox.add(key=f"k{i}") for i in range(5)]
    seen = await report(connecting(postgres_server), outbox.table, limit=2, stale_after=60)
    assert [m.id for m in seen.waiting] == ids[:2]
    assert seen.summary.unsent == 5


def test_the_kinds_are_read_from_the_relays_own_texts() -> None:
    assert refusal_of(refusal(Published.RETURNED)) is Refusal.UNROUTABLE
    assert refusal_of(refusal(Published.NACKED)) is Refusal.NACKED
    gone = ChannelNotFoundEntity("NOT_FOUND - no exchange 'x' in vhost '/'")
    assert refusal_of(refusal(gone)) is Refusal.EXCHANGE_NOT_FOUND
    assert refusal_of("something new") is Refusal.OTHER
    assert refusal_of(None) is None


async def test_a_missing_table_names_semel_migrate(postgres_server: str, outbox_table: str) -> None:
    with pytest.raises(OutboxMissing, match="semel migrate") as raised:
        await report(connecting(postgres_server), outbox_table, limit=5, stale_after=60)
    assert raised.value.exit_code == 2
    with pytest.raises(OutboxMissing):
        await summary_reader(connecting(postgres_server), outbox_table, 60)()


async def test_the_counts_read_the_unsent_rows_through_their_partial_index(
    outbox: Rows, db: psycopg.AsyncConnection[Any]
) -> None:
    # Many sent rows and a few unsent ones, as between two purges.
    table = sql.Identifier(outbox.table)
    await db.execute(
        sql.SQL(
            "INSERT INTO {} (message_id, key, fence, exchange, routing_key, body, headers,"
            " sent_at) SELECT gen_random_uuid(), 'k' || g, 0, 'shop', 'order.paid', '',"
            " '{{}}', now() FROM generate_series(1, 20000) g"
        ).format(table)
    )
    for i in range(10):
        await outbox.add(key=f"unsent-{i}")
    await db.execute(sql.SQL("ANALYZE {}").format(table))
    params = {"unroutable": "unroutable", "stale_after": 60.0, "limit": 50}
    for text in (SUMMARY, WAITING):
        statement = sql.SQL("EXPLAIN (FORMAT JSON) " + text).format(table=table)
        cur = await db.execute(statement, params)
        row = await cur.fetchone()
        assert row is not None
        plan = orjson.dumps(row[0]).decode()
        assert f"{outbox.table[:48]}_unsent_idx" in plan, plan
        assert "Seq Scan" not in plan, plan
    summary = await OutboxStatus(outbox.table).summary(db, 60.0)
    assert summary.unsent == 10

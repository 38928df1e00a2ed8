"""The SQL the PostgreSQL store sends, and the schema it runs on.

Every claim, single or batched, is one ``INSERT ... ON CONFLICT DO UPDATE ...
WHERE ... RETURNING`` statement over a list of keys; PostgreSQL locks each
conflicting row and evaluates the WHERE clause against its latest committed
version, so concurrent claimers of one key are serialised by the server and
exactly one of them writes. Every lease and retention time is computed from
the server's ``now()``. The claim and the single-key writes are written once
for both SQL stores, in :mod:`semel.stores.sql.statements`.
"""

from __future__ import annotations

from psycopg import sql

from semel.stores.sql.statements import Dialect, Shared

# Times are the server's own, so no client's clock ever shortens a lease.
# Durations are bound in seconds; the result is stored as jsonb, read as text.
POSTGRES = Dialect(
    now="now()",
    now_plus="now() + make_interval(secs => %({})s)",
    param="%({})s",
    # Microseconds since the epoch, read when the row is written: a fence's
    # start. The timestamp holds whole microseconds, so the cast is exact.
    fence_clock="(extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
    greatest="greatest",
    false="false",
    result_text="result::text",
)

# The keys arrive as two parallel arrays, sorted: each statement then locks
# its rows in one global order, so two batches sharing keys never deadlock.
ROWS = """SELECT r.key, r.fingerprint, {first_claim}
FROM unnest(%(keys)s::text[], %(fingerprints)s::text[]) AS r (key, fingerprint)"""
INSPECT_MANY = "key = ANY(%(keys)s::text[])"

# The single completion's assignments and fenced conditions, one row per completion.
COMPLETE_MANY = """
UPDATE {table} AS t SET {assignments}
FROM unnest(%(keys)s::text[], %(fences)s::bigint[], %(results)s::text[]) AS c (key, fence, result)
WHERE t.key = c.key AND t.fence = c.fence AND t.status = 'in_progress'
RETURNING t.key
"""

# Two copies, this and SQLite's (semel.stores.sqlite.sql.PURGE), the same but for
# locking: here purges and claims run side by side, so a purge skips rows
# another transaction holds and checks expiry again on delete; SQLite's write
# lock lets one writer in at a time, so it needs neither.
PURGE = """
DELETE FROM {table} WHERE key IN (
    SELECT key FROM {table} WHERE expires_at <= now() LIMIT %(limit)s FOR UPDATE SKIP LOCKED
) AND expires_at <= now()
"""


class Statements:
    """Every statement of the store, rendered for one table."""

    def __init__(self, table: str) -> None:
        name = sql.Identifier(table)
        # The table stays a placeholder: psycopg composes the quoted name in.
        shared = Shared(POSTGRES, "{table}")

        def compose(text: str, **parts: sql.Composable) -> sql.Composed:
            return sql.SQL(text).format(table=name, **parts)

        self.claim = compose(shared.claim(ROWS))
        self.inspect = compose(shared.inspect())
        self.inspect_many = compose(shared.inspect(INSPECT_MANY))
        assignments = sql.SQL(shared.set_complete("c.result::jsonb"))
        self.complete_many = compose(COMPLETE_MANY, assignments=assignments)
        self.purge = compose(PURGE)
        self.complete = compose(shared.complete("%(result)s::jsonb"))
        self.release = compose(shared.release())
        self.fail = compose(shared.fail())
        self.heartbeat = compose(shared.heartbeat())
        self.reset = compose(shared.reset())


# Two copies of one table, this and SQLite's (semel.stores.sqlite.sql.SCHEMA): the
# same columns and index in each dialect's types, times as timestamptz here
# and integer ms there, the result as jsonb here and TEXT there. A template
# over both would bury the types that are the whole difference.
def schema(table: str) -> list[sql.Composed]:
    """The DDL ``migrate`` runs; ``deploy/postgres-schema.sql`` is its rendering."""
    index = f"{table[:48]}_expires_at_idx"  # stays within the 63-byte identifier limit
    create = """CREATE TABLE IF NOT EXISTS {table} (
    key             text        PRIMARY KEY,
    fingerprint     text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed')),
    fence           bigint      NOT NULL,
    claims          integer     NOT NULL,
    lock_expires_at timestamptz,
    result          jsonb,
    error           text,
    first_seen      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL
)"""
    create_index = "CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at)"
    names = {"table": sql.Identifier(table), "index": sql.Identifier(index)}
    return [sql.SQL(create).format(**names), sql.SQL(create_index).format(**names)]

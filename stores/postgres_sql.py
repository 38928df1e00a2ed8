"""The SQL the PostgreSQL store sends, and the schema it runs on.

Every claim, single or batched, is one ``INSERT ... ON CONFLICT DO UPDATE ...
WHERE ... RETURNING`` statement over a list of keys; PostgreSQL locks each
conflicting row and evaluates the WHERE clause against its latest committed
version, so concurrent claimers of one key are serialised by the server and
exactly one of them writes. Every lease and retention time is computed from
the server's ``now()``.
"""

from __future__ import annotations

from psycopg import sql

COLUMNS = sql.SQL(
    "key, fingerprint, status, fence, claims, lock_expires_at, result::text, error,"
    " first_seen, updated_at, expires_at"
)

# Past retention a row counts as absent (its fence still grows). A live row
# gets past the claim's WHERE clause only when it is in progress with the same
# fingerprint and no lease, so "live" alone tells a takeover from a fresh start.
# The claim and the read after a refusal share these, so they never disagree.
LIVE = sql.SQL("(t.expires_at > now())")
LEASED = sql.SQL("coalesce(t.lock_expires_at > now(), false)")
POISONED = sql.SQL("(t.expires_at > now() AND t.claims >= %(max_claims)s)")

# The keys arrive as two parallel arrays, sorted: each statement then locks
# its rows in one global order, so two batches sharing keys never deadlock.
CLAIM = """
INSERT INTO {table} AS t (key, fingerprint, status, fence, claims, lock_expires_at,
                          first_seen, updated_at, expires_at)
SELECT r.key, r.fingerprint, 'in_progress', 1, 1, now() + make_interval(secs => %(ttl)s),
       now(), now(), now() + make_interval(secs => %(hold)s)
FROM unnest(%(keys)s::text[], %(fingerprints)s::text[]) AS r (key, fingerprint)
ON CONFLICT (key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    status = CASE WHEN {poisoned} THEN 'failed' ELSE 'in_progress' END,
    fence = CASE WHEN {poisoned} THEN t.fence ELSE t.fence + 1 END,
    claims = CASE WHEN {poisoned} THEN t.claims WHEN {live} THEN t.claims + 1 ELSE 1 END,
    lock_expires_at = CASE WHEN {poisoned} THEN NULL ELSE excluded.lock_expires_at END,
    result = NULL,
    error = CASE WHEN {poisoned} THEN %(poison_error)s END,
    first_seen = CASE WHEN {live} THEN t.first_seen ELSE now() END,
    updated_at = now(),
    expires_at = CASE WHEN {poisoned} THEN now() + make_interval(secs => %(retention)s)
                      ELSE excluded.expires_at END
WHERE NOT {live}
   OR (t.status = 'in_progress' AND t.fingerprint = excluded.fingerprint AND NOT {leased})
RETURNING {columns}
"""

# Reads of one key (``get``) and of the keys a claim refused; the flags are
# judged by the server's clock.
INSPECT = """
SELECT {columns}, {live}, {leased} FROM {table} AS t WHERE key = %(key)s
"""
INSPECT_MANY = """
SELECT {columns}, {live}, {leased} FROM {table} AS t WHERE key = ANY(%(keys)s::text[])
"""

# Every fenced write: only the owner of the current fence changes the row.
FENCED = " WHERE key = %(key)s AND fence = %(fence)s AND status = 'in_progress'"
SET_COMPLETE = """status = 'completed', result = %(result)s::jsonb, lock_expires_at = NULL,
    updated_at = now(), expires_at = now() + make_interval(secs => %(retention)s)"""
SET_RELEASE = """lock_expires_at = now(),
    updated_at = now(), expires_at = now() + make_interval(secs => %(hold)s)"""
SET_FAIL = """status = 'failed', error = %(error)s, lock_expires_at = NULL,
    updated_at = now(), expires_at = now() + make_interval(secs => %(retention)s)"""
SET_HEARTBEAT = """lock_expires_at = now() + make_interval(secs => %(ttl)s),
    updated_at = now(), expires_at = now() + make_interval(secs => %(hold)s)"""
SET_RESET = """status = 'in_progress', claims = 0, result = NULL, error = NULL,
    lock_expires_at = now(), updated_at = now(),
    expires_at = now() + make_interval(secs => %(hold)s)"""

# The single completion's assignments and conditions, one row per completion.
COMPLETE_MANY = """
UPDATE {table} AS t SET status = 'completed', result = c.result::jsonb, lock_expires_at = NULL,
    updated_at = now(), expires_at = now() + make_interval(secs => %(retention)s)
FROM unnest(%(keys)s::text[], %(fences)s::bigint[], %(results)s::text[]) AS c (key, fence, result)
WHERE t.key = c.key AND t.fence = c.fence AND t.status = 'in_progress'
RETURNING t.key
"""

PURGE = """
DELETE FROM {table} WHERE key IN (
    SELECT key FROM {table} WHERE expires_at <= now() LIMIT %(limit)s FOR UPDATE SKIP LOCKED
) AND expires_at <= now()
"""


class Statements:
    """Every statement of the store, rendered for one table."""

    def __init__(self, table: str) -> None:
        name = sql.Identifier(table)
        parts = {"table": name, "columns": COLUMNS, "live": LIVE, "leased": LEASED}
        self.claim = sql.SQL(CLAIM).format(poisoned=POISONED, **parts)
        self.inspect = sql.SQL(INSPECT).format(**parts)
        self.inspect_many = sql.SQL(INSPECT_MANY).format(**parts)
        self.complete_many = sql.SQL(COMPLETE_MANY).format(table=name)
        self.purge = sql.SQL(PURGE).format(table=name)

        def update(assignments: str, where: str = FENCED) -> sql.Composed:
            return sql.SQL("UPDATE {table} SET " + assignments + where).format(table=name)

        self.complete = update(SET_COMPLETE)
        self.release = update(SET_RELEASE)
        self.fail = update(SET_FAIL)
        self.heartbeat = update(SET_HEARTBEAT)
        # A row past retention is absent: resetting it would revive its fingerprint.
        self.reset = update(SET_RESET, " WHERE key = %(key)s AND expires_at > now()")


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

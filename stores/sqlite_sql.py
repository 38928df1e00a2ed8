"""The SQL the SQLite store runs, the schema it runs on, and how rows read back.

Times are integer epoch milliseconds, read from the store's clock once the
write lock is held and bound as ``:now``; durations are bound in
milliseconds too (``:ttl``, ``:retention``, ``:hold``).

A batch of claims names its keys in one JSON object, ``{key: fingerprint,
...}``, bound as ``:batch``: one statement claims them all (``json_each``
yields them as rows), about twice as fast as one statement per key. Each row
is still decided on its own, exactly as a single-key upsert would decide it.
A lone key is bound directly: ``json_each`` would add a third to its cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from stores.base import Record, Status
from stores.codec import from_epoch_ms, load_result

COLUMNS = (
    "key, fingerprint, status, fence, claims, lock_expires_at, result, error,"
    " first_seen, updated_at, expires_at"
)

# The same conditions as the PostgreSQL claim: past retention a row counts as
# absent, so a live row passing the WHERE clause is a takeover (or a
# poisoning) and any other is a fresh start.
LIVE = "(t.expires_at > :now)"
LEASED = "coalesce(t.lock_expires_at > :now, 0)"
POISONED = "(t.expires_at > :now AND t.claims >= :max_claims)"

# The rows a claim inserts: one key, or a batch. "WHERE true": without a
# WHERE, ON CONFLICT would parse as a join constraint.
ONE_KEY = "VALUES (:key, :fingerprint, 'in_progress', 1, 1, :now + :ttl, :now, :now, :now + :hold)"
BATCH = """SELECT r.key, r.value, 'in_progress', 1, 1, :now + :ttl, :now, :now, :now + :hold
FROM json_each(:batch) AS r
WHERE true"""

CLAIM = f"""
INSERT INTO {{table}} AS t (key, fingerprint, status, fence, claims, lock_expires_at,
                            first_seen, updated_at, expires_at)
{{rows}}
ON CONFLICT (key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    status = CASE WHEN {POISONED} THEN 'failed' ELSE 'in_progress' END,
    fence = CASE WHEN {POISONED} THEN t.fence ELSE t.fence + 1 END,
    claims = CASE WHEN {POISONED} THEN t.claims WHEN {LIVE} THEN t.claims + 1 ELSE 1 END,
    lock_expires_at = CASE WHEN {POISONED} THEN NULL ELSE excluded.lock_expires_at END,
    result = NULL,
    error = CASE WHEN {POISONED} THEN :poison_error END,
    first_seen = CASE WHEN {LIVE} THEN t.first_seen ELSE :now END,
    updated_at = :now,
    expires_at = CASE WHEN {POISONED} THEN :now + :retention ELSE excluded.expires_at END
WHERE NOT {LIVE}
   OR (t.status = 'in_progress' AND t.fingerprint = excluded.fingerprint AND NOT {LEASED})
RETURNING {COLUMNS}
"""

# The row a refused claim hit, with the claim's own view of it: live, leased.
INSPECT = f"SELECT {COLUMNS}, {LIVE}, {LEASED} FROM {{table}} AS t WHERE key = :key"
INSPECT_BATCH = f"""SELECT {COLUMNS}, {LIVE}, {LEASED} FROM {{table}} AS t
WHERE t.key IN (SELECT r.key FROM json_each(:batch) AS r)"""

FENCED = " WHERE key = :key AND fence = :fence AND status = 'in_progress'"
SET_COMPLETE = """status = 'completed', result = :result, lock_expires_at = NULL,
    updated_at = :now, expires_at = :now + :retention"""
SET_RELEASE = "lock_expires_at = :now, updated_at = :now, expires_at = :now + :hold"
SET_FAIL = """status = 'failed', error = :error, lock_expires_at = NULL,
    updated_at = :now, expires_at = :now + :retention"""
SET_HEARTBEAT = "lock_expires_at = :now + :ttl, updated_at = :now, expires_at = :now + :hold"
SET_RESET = """status = 'in_progress', claims = 0, result = NULL, error = NULL,
    lock_expires_at = :now, updated_at = :now, expires_at = :now + :hold"""

PURGE = """DELETE FROM {table} WHERE key IN (
    SELECT key FROM {table} WHERE expires_at <= :now LIMIT :limit)"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS {table} (
    key             TEXT    PRIMARY KEY NOT NULL,
    fingerprint     TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed')),
    fence           INTEGER NOT NULL,
    claims          INTEGER NOT NULL,
    lock_expires_at INTEGER,
    result          TEXT,
    error           TEXT,
    first_seen      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);
"""


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class Statements:
    """Every statement of the store, for one table."""

    claim: str
    claim_batch: str
    inspect: str
    inspect_batch: str
    complete: str
    release: str
    fail: str
    heartbeat: str
    reset: str
    purge: str
    schema: str


def statements(table: str) -> Statements:
    name = quote(table)
    update = f"UPDATE {name} SET "
    return Statements(
        claim=CLAIM.format(table=name, rows=ONE_KEY),
        claim_batch=CLAIM.format(table=name, rows=BATCH),
        inspect=INSPECT.format(table=name),
        inspect_batch=INSPECT_BATCH.format(table=name),
        complete=update + SET_COMPLETE + FENCED,
        release=update + SET_RELEASE + FENCED,
        fail=update + SET_FAIL + FENCED,
        heartbeat=update + SET_HEARTBEAT + FENCED,
        # A row past retention is absent: resetting it would revive its fingerprint.
        reset=update + SET_RESET + " WHERE key = :key AND expires_at > :now",
        purge=PURGE.format(table=name),
        schema=SCHEMA.format(table=name, index=quote(f"{table[:48]}_expires_at_idx")),
    )


STATUSES = {status.value: status for status in Status}  # Status(value) is an order slower

# The rows of one transaction share its clock, and a batch's rows carry the
# same few instants (now, now + ttl, ...): most conversions are cache hits.
timestamp = lru_cache(maxsize=4096)(from_epoch_ms)


def refuse_nul(texts: Iterable[str]) -> None:
    """Refuse a NUL in a key or fingerprint, batched or not.

    SQLite's JSON functions end a string at its first NUL: a batch would claim
    "a\\0b" as "a". A lone key is bound whole, but is refused all the same, so
    what a key may hold never depends on the batch it came in.
    """
    if any("\0" in text for text in texts):
        raise ValueError("a key or fingerprint holds a NUL character")


def batch_text(keys: Iterable[str], fingerprints: Iterable[str]) -> str:
    """The ``:batch`` of a claim: ``{key: fingerprint, ...}`` as JSON text."""
    return orjson.dumps(dict(zip(keys, fingerprints, strict=True))).decode()


def decode(key: str, row: tuple[Any, ...]) -> Record:
    """The record of a row read or written with ``COLUMNS`` first."""
    return Record(
        key=key,
        fingerprint=row[1],
        status=STATUSES[row[2]],
        fence=row[3],
        claims=row[4],
        lease_expires_at=timestamp(row[5]),
        result=load_result(row[6]),
        error=row[7],
        first_seen=timestamp(row[8]),
        updated_at=timestamp(row[9]),
        expires_at=timestamp(row[10]),
    )

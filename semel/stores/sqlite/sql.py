"""The SQL the SQLite store runs, the schema it runs on, and how rows read back.

Times are integer epoch milliseconds, read from the store's clock once the
write lock is held and bound as ``:now``; durations are bound in
milliseconds too (``:ttl``, ``:retention``, ``:hold``). The same reading in
microseconds, ``:now_us``, is where a key with no row starts its fence: the
clock of the one host whose processes share the file.

A batch of claims names its keys in one JSON object, ``{key: fingerprint,
...}``, bound as ``:batch``: one statement claims them all (``json_each``
yields them as rows), about twice as fast as one statement per key. Each row
is still decided on its own, exactly as a single-key upsert would decide it.
A lone key is bound directly: ``json_each`` would add a third to its cost.

The claim and the single-key writes are the PostgreSQL store's, written once
for both in :mod:`semel.stores.sql.statements`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from semel.stores.base import Record, Status
from semel.stores.codec import from_epoch_ms, load_result
from semel.stores.sql.statements import Dialect, Shared

# Times are the store's, bound as :now (ms) and :now_us (the same reading in
# microseconds, for fences); durations in ms; results as TEXT.
SQLITE = Dialect(
    now=":now",
    now_plus=":now + :{}",
    param=":{}",
    fence_clock=":now_us",
    greatest="max",
    false="0",
    result_text="result",
)

# The rows a claim inserts: one key, or a batch. "WHERE true": without a
# WHERE, ON CONFLICT would parse as a join constraint.
ONE_KEY = "VALUES (:key, :fingerprint, {first_claim})"
BATCH = """SELECT r.key, r.value, {first_claim}
FROM json_each(:batch) AS r
WHERE true"""
IN_BATCH = "t.key IN (SELECT r.key FROM json_each(:batch) AS r)"

# Two copies, this and PostgreSQL's (semel.stores.postgres.sql.PURGE), the same but
# for locking: the write lock lets one writer in at a time, so none of the row
# locking PostgreSQL's purge needs against concurrent claims.
PURGE = """DELETE FROM {table} WHERE key IN (
    SELECT key FROM {table} WHERE expires_at <= :now LIMIT :limit)"""

# Two copies of one table, this and PostgreSQL's (semel.stores.postgres.sql.schema):
# the same columns and index in each dialect's types, times as integer ms here
# and timestamptz there, the result as TEXT here and jsonb there.
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
    shared = Shared(SQLITE, name)
    return Statements(
        claim=shared.claim(ONE_KEY),
        claim_batch=shared.claim(BATCH),
        inspect=shared.inspect(),
        inspect_batch=shared.inspect(IN_BATCH),
        complete=shared.complete(":result"),
        release=shared.release(),
        fail=shared.fail(),
        heartbeat=shared.heartbeat(),
        reset=shared.reset(),
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

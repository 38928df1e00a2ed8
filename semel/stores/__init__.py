"""Idempotency stores: run a piece of work once per key, whatever the backend.

Open a store from a URL with :func:`open_store` (the URL forms are in
:mod:`semel.stores.opening`), and close it when done, by ``async with`` or
``await store.close()``::

    async with await open_store("redis://localhost:6379/0") as store:
        claim = await store.claim(key, fingerprint)

A key's life, as every :class:`Store` keeps it (:mod:`semel.stores.base` has the
state machine):

``claim(key, fingerprint) -> Claim``
    Decided in one atomic step; ``claim.outcome`` (an :class:`Outcome`) says:
    ``CLAIMED``: the caller owns the key under ``claim.fence`` until
    ``config.lock_ttl`` runs out; ``DUPLICATE``: completed before,
    ``claim.record.result`` is the stored result; ``IN_PROGRESS``: another
    holder's lease is live (``claim.record.lease_expires_at``); ``MISMATCH``:
    the key was used with another fingerprint, nothing written; ``POISON``:
    claimed ``config.max_claims`` times without completing, the key is failed
    now; ``FAILED``: failed before, nothing written. Raises
    :class:`KeyRefused` when the store cannot hold the key.
``heartbeat(key, fence) -> bool``
    Extends the lease by ``lock_ttl`` from now; ``False`` when the fence lost
    the key or the lease is over: stop the work.
``complete(key, fence, result) -> bool``
    Stores ``result`` (JSON, or common Python values in their JSON form:
    :mod:`semel.stores.codec`) for ``config.retention``; ``False`` when the
    fence lost the key. Raises
    :class:`ResultTooLarge` past the backend's limit, and
    ``orjson.JSONEncodeError`` for a result with no JSON form; the key is
    then as it was.
``fail(key, fence, error) -> bool``
    Marks the key failed for good (remembered for the retention); ``False``
    when the fence lost the key.
``release(key, fence) -> bool``
    Gives the claim up, so the next claim takes the key at once; ``False``
    when the fence lost the key.
``get(key) -> Record | None``
    The key's :class:`Record` (status, fence, claims, lease, result, error),
    or ``None`` when absent or past retention.
``reset(key) -> bool``
    Forgets a failed key's outcome so it runs again; ``False`` unless failed.
``migrate() -> list[str]``
    Creates the table, indexes or TTL set-up, safe to run twice; returns
    warnings for the operator. SQLite migrates itself when opened.
``purge(limit) -> int``
    SQLite and PostgreSQL only (Redis and DynamoDB expire keys themselves):
    deletes up to ``limit`` records past retention, returns how many.
``close()``
    Releases the connections; the store is unusable afterwards.

Every call may raise :class:`StoreUnavailable` (unreachable, timed out, a
condition that passes: try again later) or :class:`StoreMisconfigured`
(reachable but not set up: a missing table, a permission denied); all store
errors derive from :class:`StoreError`, itself a :class:`SemelError`.

Backends are imported only when a URL (or the consumer's settings) selects
one, so a Redis user never needs psycopg or boto3 installed. Each backend
package (``semel.stores.sqlite``, ``.postgres``, ``.redis``, ``.dynamodb``)
exposes ``async def open_store(*, ..., config: StoreConfig) -> Store``, whose
other keyword arguments are plain values: ``semel.stores`` never reads the
consumer's settings.
"""

from semel.stores.base import JSON, Claim, Outcome, Record, Status, Store, StoreConfig
from semel.stores.errors import (
    FencedOut,
    KeyRefused,
    ResultTooLarge,
    SemelError,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
)
from semel.stores.opening import open_store

__all__ = [
    "JSON",
    "Claim",
    "FencedOut",
    "KeyRefused",
    "Outcome",
    "Record",
    "ResultTooLarge",
    "SemelError",
    "Status",
    "Store",
    "StoreConfig",
    "StoreError",
    "StoreMisconfigured",
    "StoreUnavailable",
    "open_store",
]

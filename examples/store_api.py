"""The store without the consumer ("Using the store directly"), run by tests/test_docs.py.

``python examples/store_api.py [URL]`` charges an order twice against the store
at URL (a local Redis by default); the second call finds the first's result.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from typing import Any

import orjson

# --8<-- [start:store]
from semel.stores import JSON, Outcome, Store, StoreConfig, open_store

charges: list[int] = []  # stands in for a payment provider


async def charge_once(store: Store, key: str, request: dict[str, Any]) -> JSON:
    """Charge ``request`` once per ``key``; a repeated call returns the first result."""
    # The fingerprint tells a retry of this request from another one reusing its key.
    fingerprint = hashlib.sha256(orjson.dumps(request, option=orjson.OPT_SORT_KEYS)).hexdigest()
    claim = await store.claim(key, fingerprint)
    if claim.outcome is Outcome.DUPLICATE:
        return claim.record.result  # done before: the stored result, nothing charged
    if claim.outcome is not Outcome.CLAIMED:
        # IN_PROGRESS (someone holds it now), MISMATCH, POISON or FAILED.
        raise RuntimeError(f"{key}: {claim.outcome}")
    try:
        charges.append(request["amount"])  # the work, run by one holder at a time
        result = {"charge": len(charges)}
    except Exception:
        await store.release(key, claim.fence)  # let the next attempt in at once
        raise
    # False: the lease ran out and another claim took the key over meanwhile.
    if not await store.complete(key, claim.fence, result):
        raise RuntimeError(f"{key}: taken over before completion")
    return result


async def main(
    url: str = "redis://localhost:6379/0", prefix: str = "store-api-example"
) -> tuple[JSON, JSON]:
    # Keys are stored as "<prefix>:<key>": services sharing one store never collide.
    config = StoreConfig(lock_ttl=30, retention=3600, key_prefix=prefix)
    async with await open_store(url, config=config) as store:
        await store.migrate()  # creates the table (SQL, DynamoDB); safe to repeat
        first = await charge_once(store, "order-7", {"order": 7, "amount": 1250})
        again = await charge_once(store, "order-7", {"order": 7, "amount": 1250})
        record = await store.get("order-7")
    print(first, again, record and record.status)  # {'charge': 1} {'charge': 1} completed
    return first, again


# --8<-- [end:store]

if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))

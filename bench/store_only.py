"""semel's store alone, without the broker: claim + complete pairs per second.

Beside the Powertools comparison it tells the server's limit from semel's:
if pairs/s do not grow from one request in flight to a prefetch window of
them, the server answers one request at a time and no client can go faster.
"""

from __future__ import annotations

import asyncio
import importlib
import time

from bench.backends import Backends
from bench.broker import BenchError
from stores.base import Outcome, Store

FINGERPRINT = "bench"
WARM_UP = 20  # pairs before the timing starts: connection set-up is not measured


async def _pair(store: Store, key: str) -> None:
    claim = await store.claim(key, FINGERPRINT)
    if claim.outcome is not Outcome.CLAIMED:
        raise BenchError(f"store-only run: {key} was {claim.outcome.value}, not a new key")
    await store.complete(key, claim.fence, None)


async def pairs_per_second(backends: Backends, kind: str, pairs: int, in_flight: int) -> float:
    """Claim and complete ``pairs`` new keys, ``in_flight`` at a time."""
    settings = backends.settings(kind, f"store-{in_flight}")
    await backends.migrate(settings)
    module = importlib.import_module(f"stores.{kind}")
    store: Store = await module.open_store(settings)
    window = asyncio.Semaphore(in_flight)

    async def pair(key: str) -> None:
        async with window:
            await _pair(store, key)

    try:
        await asyncio.gather(*(pair(f"warm-{n}") for n in range(WARM_UP)))
        started = time.perf_counter()
        await asyncio.gather(*(pair(f"k-{n}") for n in range(pairs)))
        return pairs / (time.perf_counter() - started)
    finally:
        await store.close()

"""semel's store alone, without the broker: claim + complete pairs per second.

Beside the Powertools comparison it tells the server's limit from semel's:
if pairs/s do not grow from one request in flight to a prefetch window of
them, the server answers one request at a time and no client can go faster.
The CPU each side spends per pair says which one runs out first: this
process's (the client), and the DynamoDB server's when this run started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import psutil

from bench.backends import Backends, open_store
from bench.broker import BenchError
from semel.stores.base import Outcome, Store

FINGERPRINT = "bench"
WARM_UP = 20  # pairs before the timing starts: connection set-up is not measured


async def _pair(store: Store, key: str) -> None:
    claim = await store.claim(key, FINGERPRINT)
    if claim.outcome is not Outcome.CLAIMED:
        raise BenchError(f"store-only run: {key} was {claim.outcome.value}, not a new key")
    await store.complete(key, claim.fence, None)


@dataclass(frozen=True, slots=True)
class StoreRun:
    pairs_per_s: float
    client_us: float  # this process's CPU per pair
    server_us: float | None  # the server's CPU per pair, if it is a child of this run


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def server_process(url: str | None) -> psutil.Process | None:
    """The child of this run listening on ``url``'s port (the local DynamoDB server)."""
    port = urlsplit(url).port if url else None
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            for conn in child.net_connections("tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
                    return child
    return None


async def store_run(backends: Backends, kind: str, pairs: int, in_flight: int) -> StoreRun:
    """Claim and complete ``pairs`` new keys, ``in_flight`` at a time."""
    server = server_process(backends.dynamodb_url) if kind == "dynamodb" else None
    client = psutil.Process()
    before = _cpu(client), _cpu(server) if server else 0.0
    rate = await _pairs_per_second(backends, kind, pairs, in_flight)
    count = pairs + WARM_UP
    client_us = (_cpu(client) - before[0]) / count * 1e6
    server_us = (_cpu(server) - before[1]) / count * 1e6 if server else None
    return StoreRun(rate, client_us, server_us)


async def _pairs_per_second(backends: Backends, kind: str, pairs: int, in_flight: int) -> float:
    settings = backends.settings(kind, f"store-{in_flight}")
    await backends.migrate(settings)
    store = await open_store(settings)
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

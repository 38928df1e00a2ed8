"""The worker's cache of completed keys is bounded in memory too: once full and
turned over, further batches of new keys take no more.

A first turnover of the cache does grow it once: the hash table under its LRU
fills with the slots of evicted keys and is rebuilt larger (CPython sizes the
new table from three times the live entries). That is a step, not a slope,
which is why this test compares a later batch with the one before it.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from semel.consumer.delivery.completed_cache import CompletedCache

FP = "f" * 64


def _fill(cache: CompletedCache, tag: str, count: int) -> None:
    for index in range(count):
        cache.completed(f"{tag}-{index}", FP, fence=1, sent_at=0.0)


@pytest.mark.timeout(60)
def test_a_full_cache_turning_over_again_takes_no_more_memory() -> None:
    size = 5_000
    cache = CompletedCache(size, ttl=300.0, retention=86_400.0, clock=lambda: 1_000.0)
    tracemalloc.start()
    try:
        traced = []
        for tag in ("first", "second", "third", "fourth"):
            _fill(cache, tag, size)
            gc.collect()
            traced.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert len(cache) == size
    # From the second turnover on, every batch of new keys replaces as much as
    # it adds: a few KiB of noise at most, where one entry kept per key would be
    # over a MiB.
    assert abs(traced[3] - traced[2]) < 64 * 1024, traced
    assert abs(traced[2] - traced[1]) < 64 * 1024, traced

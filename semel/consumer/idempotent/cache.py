"""An in-process LRU of completed keys: a hit answers a duplicate without the store.

Only completed keys are kept, and only until their record would be forgotten
by the store: a completed key stays completed for its retention, so a hit
answers what the store would. A key forgotten by the store sooner (purged,
evicted) is still answered from here until then.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from semel.consumer.delivery.completed_cache import Lru


@dataclass(frozen=True, slots=True)
class Completed:
    """One completed key, as the cache keeps it."""

    fingerprint: str
    result: Any  # the stored JSON, rebuilt for each hit: no caller shares another's object
    fence: int
    completed_at: datetime | None
    expires_at: datetime | None
    until: float  # monotonic seconds after which the entry is dropped


class CompletedKeys(Lru[Completed]):
    """At most ``size`` entries, the least recently used dropped first; 0 keeps none.

    The worker's cache of completed keys is the same LRU with smaller entries:
    it needs no stored result, since its duplicates are only ACKed.
    """

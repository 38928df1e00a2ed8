"""An in-process LRU of completed keys: a hit answers a duplicate without the store.

Only completed keys are kept, and only until their record would be forgotten
by the store: a completed key stays completed for its retention, so a hit
answers what the store would. A key forgotten by the store sooner (purged,
evicted) is still answered from here until then.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class Completed:
    """One completed key, as the cache keeps it."""

    fingerprint: str
    result: Any  # the stored JSON, rebuilt for each hit: no caller shares another's object
    fence: int
    completed_at: datetime | None
    expires_at: datetime | None
    until: float  # monotonic seconds after which the entry is dropped


class CompletedKeys:
    """At most ``size`` entries, the least recently used dropped first; 0 keeps none."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[str, Completed] = OrderedDict()

    def get(self, key: str) -> Completed | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.until <= time.monotonic():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: Completed) -> None:
        if self.size <= 0:
            return
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

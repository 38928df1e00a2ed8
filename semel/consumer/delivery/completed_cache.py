"""Keys known completed, kept in the worker's memory so that most duplicates are
ACKed without a store round trip.

When the cache answers, and only then: the delivery's key has an entry, the
entry has not expired, and the delivery's fingerprint is the one the store
holds for the key. The answer is "duplicate": ACK, handler not run, nothing
written, as the store itself would have answered. Anything else (no entry,
expired, another fingerprint) goes to the store exactly as without a cache,
so a copy with a different body is still decided by the store (a
payload-mismatch dead letter).

What goes in, and only that:

- a key this worker completed, once the store confirmed the completion;
- a key a claim found completed (a ``duplicate`` answer), with the
  fingerprint the store compared.

Never a failed key: ``semel dlq replay`` resets a failed key so that its
replayed copy runs again, and a cached answer would ACK that copy unrun. Never
a key in progress. A completed key is final until its retention ends (a reset
leaves it completed), so an entry stays true while it lives, and it lives no
longer than the shorter of the cache's TTL and the record's retention left,
less :data:`MARGIN`.

What the cache cannot see: a record deleted by hand, or lost by a store that
forgets writes (Redis without persistence, a failover to a replica that had
not received the completion). Such a key is still answered "duplicate" for
up to the TTL where the store would have run it again. Another worker's
completions never reach this cache: its copies ask the store, as before.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from semel.stores.base import Claim, Outcome, Status

# Seconds kept off a record's retention: an entry must end before the store
# could forget the key. Covers the skew between this host's clock and the
# store's (a duplicate's record carries the store's expiry) and, for this
# worker's own completions, a transactional store's commit a little before
# the completion call.
MARGIN = 60.0


class Expiring(Protocol):
    """An entry that says until when (monotonic seconds) it may be used."""

    @property
    def until(self) -> float: ...


E = TypeVar("E", bound=Expiring)


class Lru(Generic[E]):
    """At most ``size`` entries, the least recently used dropped first; 0 keeps none.

    An expired entry is dropped when it is looked up; one never looked up again
    leaves with the least recently used.
    """

    def __init__(self, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.size = size
        self._clock = clock
        self._entries: OrderedDict[str, E] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> E | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.until <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: E) -> None:
        if self.size <= 0:
            return
        entries = self._entries
        if key in entries:  # a new key goes in last already
            entries.move_to_end(key)
        entries[key] = entry
        while len(entries) > self.size:
            entries.popitem(last=False)


@dataclass(frozen=True, slots=True)
class Known:
    """One key known completed: the fingerprint the store holds, and the fence that
    completed it (the ``fence`` a duplicate's log line and span carry)."""

    fingerprint: str
    fence: int
    until: float  # monotonic seconds after which the entry is not used


class CompletedCache:
    """Keys known completed; see the module's docstring for when it answers.

    ``retention`` is the store's (``SEMEL_RETENTION``): a completion this
    worker makes is kept that long by the store. ``ttl`` bounds every entry.
    """

    def __init__(
        self,
        size: int,
        ttl: float,
        retention: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._entries: Lru[Known] = Lru(size, clock)
        self._ttl = ttl
        self._retention = retention
        self._clock = clock
        self._wall = wall

    def __len__(self) -> int:
        return len(self._entries)

    def answer(self, key: str, fingerprint: str) -> Known | None:
        """The entry that makes this delivery a duplicate, or ``None``: ask the store."""
        known = self._entries.get(key)
        if known is None or known.fingerprint != fingerprint:
            return None
        return known

    def completed(self, key: str, fingerprint: str, fence: int, sent_at: float) -> None:
        """This worker's completion of ``key`` under ``fence`` was confirmed; the call
        was first sent at ``sent_at`` (monotonic).

        The store set the record's expiry when it wrote the completion, after
        ``sent_at``: retention from ``sent_at`` ends no later, with no clock of
        the store's to compare with.
        """
        self._keep(key, fingerprint, fence, sent_at + self._retention)

    def learn(self, key: str, claim: Claim) -> None:
        """The store's answer to a claim of ``key``: a key found completed is kept
        (the store's fingerprint, until its expiry), anything else ignored."""
        record = claim.record
        if claim.outcome is not Outcome.DUPLICATE or record.status is not Status.COMPLETED:
            return
        if record.expires_at is None:  # nothing will forget it: only the TTL bounds it
            ends = math.inf
        else:
            ends = self._clock() + (record.expires_at.timestamp() - self._wall())
        self._keep(key, record.fingerprint, record.fence, ends)

    def _keep(self, key: str, fingerprint: str, fence: int, forgotten_at: float) -> None:
        """Keep ``key`` until the TTL, or ``MARGIN`` before the store may forget it."""
        now = self._clock()
        until = min(now + self._ttl, forgotten_at - MARGIN)
        if until > now:
            self._entries.put(key, Known(fingerprint, fence, until))

"""Backpressure: fewer deliveries at the store while it answers slowly.

A store's answer takes longer the more calls wait in front of it: a server
that is loaded, throttled, or one request at a time. With a full prefetch
window (hundreds of deliveries) on such a store, a claim, a heartbeat or a
completion can wait longer than the lease itself, and then another copy of
the key takes the lapsed lease over and the handler runs twice without any
crash.

:class:`Pressure` keeps the number of deliveries between their claim and
their settlement under a limit that follows the store's answer times, the
way TCP sizes its window:

- an answer slower than ``target`` halves the limit, at most once per
  ``target`` seconds, so one slow batch counts once;
- a delivery settled without any cut since it was admitted raises the limit:
  by one each until the first cut (slow start), then by one per limit's
  worth of them. Growth waits for a whole delivery, not for its claim: a
  delivery's heartbeats and completion come after its claim, and a limit
  grown on quick claims alone would let in more work than the store can
  then renew;
- it starts low (:data:`START`): a worker that took a full window at once
  onto a slow store would have every lease of it at stake before the first
  answer says how slow the store is. With a quick store it is at the
  ceiling within a few hundred deliveries.

Deliveries over the limit wait before their claim, holding no key, so no
lease is spent while they wait.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Callable

START = 4  # deliveries admitted at once before any answer was timed


class Pressure:
    """An admission limit for deliveries, driven by the store's answer times."""

    def __init__(
        self,
        ceiling: int,
        target: float,
        on_limit: Callable[[int], None] = lambda limit: None,
    ) -> None:
        self.ceiling = max(1, ceiling)
        self.target = target
        self.limit = min(START, self.ceiling)
        self._cut_to = self.ceiling  # the limit of the last cut: growth slows above it
        self._credit = 0.0
        self.admitted = 0
        self._on_limit = on_limit
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._cut_at = -float("inf")
        on_limit(self.limit)

    async def admit(self) -> float:
        """Wait until one more delivery may go to the store; the admission's
        time, for :meth:`leave`."""
        if self.admitted < self.limit and not self._waiting:
            self.admitted += 1
            return time.monotonic()
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter  # admitted is counted for it by whoever woke it
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.leave(math.inf)  # woken and cancelled in one turn: pass the place on
            elif waiter in self._waiting:  # else already passed over by _wake
                self._waiting.remove(waiter)
            raise
        return time.monotonic()

    def leave(self, admitted_at: float) -> None:
        """The delivery admitted at ``admitted_at`` is settled."""
        self.admitted -= 1
        if admitted_at > self._cut_at and self.limit < self.ceiling:
            self._credit += 1.0 if self.limit < self._cut_to else 1.0 / self.limit
            if self._credit >= 1.0:
                self._credit = 0.0
                self._set(self.limit + 1)
        self._wake()

    def answered(self, seconds: float) -> None:
        """A store call of an admitted delivery took ``seconds``."""
        if seconds <= self.target:
            return
        now = time.monotonic()
        if now - self._cut_at >= self.target and self.limit > 1:
            self._cut_at = now
            self._cut_to = max(1, self.limit // 2)
            self._set(self._cut_to)

    def _set(self, limit: int) -> None:
        self.limit = limit
        self._on_limit(limit)

    def _wake(self) -> None:
        while self._waiting and self.admitted < self.limit:
            waiter = self._waiting.popleft()
            if not waiter.done():
                self.admitted += 1
                waiter.set_result(None)

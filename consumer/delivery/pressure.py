"""Backpressure: fewer deliveries at the store while it answers slowly.

A store's answer takes longer the more calls wait in front of it: a server
that is loaded, throttled, or one request at a time. With a full prefetch
window (hundreds of deliveries) on such a store, a claim or a completion can
wait longer than the lease itself, and then another copy of the key takes the
lapsed lease over and the handler runs twice without any crash.

:class:`Pressure` keeps the number of deliveries between their claim and
their settlement under a limit that follows the store's answer times
(additive increase, multiplicative decrease, as TCP does with its window):
an answer slower than ``target`` halves the limit, at most once per
``target`` seconds so one slow batch counts once; a quick answer raises it
by one, up to ``ceiling``. Deliveries over the limit wait before their claim,
holding no key, so no lease is spent while they wait.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

QUICK = 0.5  # an answer within this share of the target lets the limit grow


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
        self.limit = self.ceiling
        self.admitted = 0
        self._on_limit = on_limit
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._cut_at = -float("inf")
        on_limit(self.limit)

    async def admit(self) -> None:
        """Wait until one more delivery may go to the store."""
        if self.admitted < self.limit and not self._waiting:
            self.admitted += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter  # admitted is counted for it by whoever woke it
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.leave()  # woken and cancelled in the same turn: pass the place on
            elif waiter in self._waiting:  # else already passed over by _wake
                self._waiting.remove(waiter)
            raise

    def leave(self) -> None:
        """One admitted delivery is settled."""
        self.admitted -= 1
        self._wake()

    def answered(self, seconds: float) -> None:
        """A store call of an admitted delivery took ``seconds``."""
        if seconds > self.target:
            now = time.monotonic()
            if now - self._cut_at >= self.target and self.limit > 1:
                self._cut_at = now
                self._set(max(1, self.limit // 2))
        elif seconds < self.target * QUICK and self.limit < self.ceiling:
            self._set(self.limit + 1)
            self._wake()

    def _set(self, limit: int) -> None:
        self.limit = limit
        self._on_limit(limit)

    def _wake(self) -> None:
        while self._waiting and self.admitted < self.limit:
            waiter = self._waiting.popleft()
            if not waiter.done():
                self.admitted += 1
                waiter.set_result(None)

"""The one back-off of every loop that waits and tries again.

Store writes, store pings, consuming again, connecting, the outbox relay: each
waits a pause that doubles from ``first`` up to ``longest``, and starts over
from ``first`` after a success. One helper, so a fix (jitter, a cap) lands once.

Each pause is drawn from the upper half of its ceiling ("equal jitter"): loops
that failed together (the completions of one batch, the workers of one store)
part ways instead of retrying in lockstep, and no pause is ever shorter than
half its ceiling, so a store that is away is never pressed harder than the
doubling says.
"""

from __future__ import annotations

import asyncio
import random as _random
from collections.abc import Callable
from dataclasses import dataclass, field

_MAX_DOUBLINGS = 64  # past this every ceiling is ``longest`` anyway; 2**n stays a float


def ceiling(attempt: int, first: float, longest: float) -> float:
    """The longest pause before try ``attempt + 1`` (0-based ``attempt``)."""
    return min(first * 2.0 ** min(attempt, _MAX_DOUBLINGS), longest)


def pause(attempt: int, first: float, longest: float, draw: float) -> float:
    """The pause before try ``attempt + 1``, for ``draw`` in [0, 1]."""
    return ceiling(attempt, first, longest) * (0.5 + draw / 2)


@dataclass(slots=True)
class Backoff:
    """A doubling, jittered pause: :meth:`wait` sleeps the next one, :meth:`reset` starts over."""

    first: float
    longest: float
    random: Callable[[], float] = _random.random
    attempt: int = field(init=False, default=0)

    @property
    def pause(self) -> float:
        """The longest the next pause can be."""
        return ceiling(self.attempt, self.first, self.longest)

    def next(self) -> float:
        """The pause to take now; the one after it doubles its ceiling, up to ``longest``."""
        taken = pause(self.attempt, self.first, self.longest, self.random())
        self.attempt += 1
        return taken

    async def wait(self) -> float:
        """Sleep the next pause; returns how long it was."""
        taken = self.next()
        await asyncio.sleep(taken)
        return taken

    def reset(self) -> None:
        self.attempt = 0

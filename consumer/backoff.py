"""The one back-off of every loop that waits and tries again.

Store writes, store pings, consuming again, connecting, the outbox relay: each
waits a pause that doubles from ``first`` up to ``longest``, and starts over
from ``first`` after a success. One helper, so a fix (jitter, a cap) lands once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    """A doubling pause: :meth:`wait` sleeps the next one, :meth:`reset` starts over."""

    first: float
    longest: float
    pause: float = field(init=False)

    def __post_init__(self) -> None:
        self.pause = self.first

    def next(self) -> float:
        """The pause to take now; the one after it doubles, up to ``longest``."""
        pause = self.pause
        self.pause = min(pause * 2, self.longest)
        return pause

    async def wait(self) -> float:
        """Sleep the next pause; returns how long it was."""
        pause = self.next()
        await asyncio.sleep(pause)
        return pause

    def reset(self) -> None:
        self.pause = self.first

"""Timers that many callbacks share: one event-loop timer per slice of due time.

A lease's first renewal is due a third of the lease after its claim, and
nearly every delivery settles before that: a loop timer of its own per
delivery, set and then cancelled, is work paid for nothing (on uvloop, a
libuv handle opened and closed each time). Here the callbacks due within the
same slice of time (an eighth of their delay) share one loop timer, and a
cancel only forgets the callback. Each runs up to one slice early, never late,
and in the context it was scheduled from, as ``loop.call_later`` would run it.
A deadline, which must never fire early (a handler's time limit), takes
:meth:`SharedTimers.call_no_sooner` instead: never early, and late by at most
a sixty-fourth of its delay or a quarter of a second, whichever is less.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import weakref
from collections.abc import Callable

SLICES_PER_DELAY = 8  # a callback runs at most delay / SLICES_PER_DELAY early
DEADLINE_SLICES_PER_DELAY = 64  # a deadline runs at most delay / 64 late ...
DEADLINE_MOST_LATE = 0.25  # ... and never more than this many seconds late


def _forgotten() -> None:
    """What a run or cancelled slot holds instead of its callback."""


class Slot:
    """One callback waiting in a slice; :meth:`cancel` forgets it."""

    __slots__ = ("_callback", "_context", "_slice")

    def __init__(
        self, slice_: set[Slot], callback: Callable[[], object], *, in_context: bool = True
    ) -> None:
        self._slice = slice_
        self._callback = callback
        self._context = contextvars.copy_context() if in_context else None

    def cancel(self) -> None:
        self._slice.discard(self)
        self._forget()

    def run(self) -> None:
        callback, context = self._callback, self._context
        self._forget()
        if context is None:
            callback()
        else:
            context.run(callback)

    def _forget(self) -> None:
        # The callback is most often a bound method of the object that holds
        # this slot (a lease's Renewal, a handler's time limit): kept, the pair
        # is a reference cycle that only the cyclic collector frees, and with
        # it the delivery's context (its message, its body, a front door's
        # objects), about 30 objects per delivery left to the collector.
        self._callback = _forgotten
        self._context = None


class SharedTimers:
    """The slices of one event loop, each with the loop timer that runs it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._slices: dict[tuple[float, int], set[Slot]] = {}

    def call_later(self, delay: float, callback: Callable[[], object]) -> Slot:
        """Run ``callback`` ``delay`` seconds from now, or up to an eighth of that sooner."""
        grain = delay / SLICES_PER_DELAY
        if not grain > 0:  # due now (or nonsense): a slice of its own, run at once
            slot = Slot(set(), callback)
            slot._slice.add(slot)
            self._loop.call_soon(self._run, slot._slice, context=contextvars.Context())
            return slot
        # Rounded down: the slice starts at or before the due time, and after
        # now, since the delay spans SLICES_PER_DELAY grains.
        index = math.floor((self._loop.time() + delay) / grain)
        return self._join((grain, index), callback)

    def call_no_sooner(self, delay: float, callback: Callable[[], object]) -> Slot:
        """Run ``callback`` ``delay`` seconds from now, never sooner, and at most
        ``min(delay / 64, 0.25)`` seconds later; in no context of its own (a
        deadline's callback only cancels a task), which saves a copy per call."""
        grain = min(delay / DEADLINE_SLICES_PER_DELAY, DEADLINE_MOST_LATE)
        if not grain > 0:
            return self.call_later(delay, callback)
        # Rounded up: the slice ends at or after the due time.
        index = math.ceil((self._loop.time() + delay) / grain)
        return self._join((grain, index), callback, in_context=False)

    def _join(
        self, name: tuple[float, int], callback: Callable[[], object], *, in_context: bool = True
    ) -> Slot:
        """``callback`` in the slice ``name``, run at ``index * grain``."""
        slice_ = self._slices.get(name)
        if slice_ is None:
            slice_ = self._slices[name] = set()
            # An empty context: the slice belongs to none of its callbacks.
            grain, index = name
            self._loop.call_at(index * grain, self._fire, name, context=contextvars.Context())
        slot = Slot(slice_, callback, in_context=in_context)
        slice_.add(slot)
        return slot

    def _fire(self, name: tuple[float, int]) -> None:
        self._run(self._slices.pop(name, set()))

    @staticmethod
    def _run(slice_: set[Slot]) -> None:
        for slot in list(slice_):
            if slot in slice_:  # not cancelled by a callback that ran before it
                slice_.discard(slot)
                slot.run()


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SharedTimers] = (
    weakref.WeakKeyDictionary()
)


def shared_timers(loop: asyncio.AbstractEventLoop) -> SharedTimers:
    """``loop``'s shared timers, made on first use."""
    timers = _BY_LOOP.get(loop)
    if timers is None:
        timers = _BY_LOOP[loop] = SharedTimers(loop)
    return timers

"""Shared timers: a callback runs within the last slice of its delay, never late,
and callbacks due in the same slice share one loop timer."""

from __future__ import annotations

import asyncio
import contextvars
import gc

from semel.consumer.delivery.timers import (
    DEADLINE_MOST_LATE,
    DEADLINE_SLICES_PER_DELAY,
    SLICES_PER_DELAY,
    shared_timers,
)


async def test_a_callback_runs_within_the_last_slice_of_its_delay() -> None:
    loop = asyncio.get_running_loop()
    ran = loop.create_future()
    delay = 0.4
    started = loop.time()
    shared_timers(loop).call_later(delay, lambda: ran.set_result(loop.time()))
    at = await asyncio.wait_for(ran, 5)
    # Never late (the loop's own timer slack aside), at most one slice early.
    # The upper bound is loose: a loaded machine may pause the loop itself; the
    # slice arithmetic is checked exactly by the tests that read the slices.
    assert started + delay - delay / SLICES_PER_DELAY - 0.01 <= at <= started + delay + 1.0


async def test_callbacks_due_in_one_slice_share_one_loop_timer_and_a_cancel_forgets_one() -> None:
    loop = asyncio.get_running_loop()
    timers = shared_timers(loop)
    ran: list[int] = []
    done = asyncio.Event()
    # A delay whose slices are long, so that the three land in one.
    slots = [timers.call_later(8.0, lambda n=n: ran.append(n)) for n in range(3)]  # type: ignore[misc]
    assert len({id(slot._slice) for slot in slots}) == 1
    slots[1].cancel()
    # Run the slice now rather than waiting for it: what its loop timer will do.
    name = next(name for name, slice_ in timers._slices.items() if slots[0]._slice is slice_)
    timers._fire(name)
    loop.call_soon(done.set)
    await done.wait()
    assert sorted(ran) == [0, 2]


async def test_a_callback_that_cancels_a_later_one_of_its_slice_wins() -> None:
    loop = asyncio.get_running_loop()
    timers = shared_timers(loop)
    ran: list[str] = []
    slots: dict[str, object] = {}

    def first() -> None:
        ran.append("first")
        for name, slot in slots.items():
            if name != "first" and hasattr(slot, "cancel"):
                slot.cancel()

    slots["first"] = timers.call_later(8.0, first)
    slots["second"] = timers.call_later(8.0, lambda: ran.append("second"))
    name = next(iter(timers._slices))
    timers._fire(name)
    # Set order decides which runs first: either only "first" ran (it cancelled
    # the other), or "second" ran before "first" was reached.
    assert ran in (["first"], ["second", "first"])


async def test_no_delay_runs_on_the_next_turn() -> None:
    loop = asyncio.get_running_loop()
    ran = loop.create_future()
    shared_timers(loop).call_later(0.0, lambda: ran.set_result(True))
    assert await asyncio.wait_for(ran, 1)


async def test_each_loop_has_its_own() -> None:
    mine = shared_timers(asyncio.get_running_loop())
    other = asyncio.new_event_loop()
    try:
        assert shared_timers(other) is not mine
        assert shared_timers(asyncio.get_running_loop()) is mine
    finally:
        other.close()


async def test_a_callback_runs_in_the_context_it_was_scheduled_from() -> None:
    loop = asyncio.get_running_loop()
    timers = shared_timers(loop)
    var: contextvars.ContextVar[str] = contextvars.ContextVar("t.timers.var", default="none")
    seen: list[str] = []

    def schedule(value: str) -> None:
        var.set(value)
        timers.call_later(8.0, lambda: seen.append(var.get()))

    contextvars.copy_context().run(schedule, "first")
    contextvars.copy_context().run(schedule, "second")
    timers._fire(next(iter(timers._slices)))
    assert sorted(seen) == ["first", "second"]


async def test_a_deadline_never_runs_early_and_at_most_one_grain_late() -> None:
    loop = asyncio.get_running_loop()
    timers = shared_timers(loop)
    for delay in (0.05, 0.3):
        ran = loop.create_future()
        started = loop.time()
        timers.call_no_sooner(delay, lambda ran=ran: ran.set_result(loop.time()))  # type: ignore[misc]
        at = await asyncio.wait_for(ran, 5)
        grain = min(delay / DEADLINE_SLICES_PER_DELAY, DEADLINE_MOST_LATE)
        # The loop's own clock resolution aside, never before the delay is over.
        assert at >= started + delay - 0.002, (delay, at - started)
        assert at <= started + delay + grain + 1.0, (delay, at - started)  # loop pauses aside


async def test_deadlines_due_within_one_grain_share_a_slice_rounded_up() -> None:
    loop = asyncio.get_running_loop()
    timers = shared_timers(loop)
    delay = 300.0  # grain: the quarter of a second cap
    # The clock is read around the calls, not after the checks: a loaded machine
    # may pause between them for longer than a grain.
    before = loop.time()
    slots = [timers.call_no_sooner(delay, lambda: None) for _ in range(50)]
    after = loop.time()
    slices = {id(slot._slice) for slot in slots}
    assert len(slices) <= 2  # the calls may straddle one grain's boundary
    for name, slice_ in list(timers._slices.items()):
        if any(slot._slice is slice_ for slot in slots):
            grain, index = name
            assert grain == DEADLINE_MOST_LATE
            # Never early, and at most one grain late.
            assert index * grain >= before + delay
            assert index * grain <= after + delay + grain
    for slot in slots:
        slot.cancel()


async def test_a_slot_run_or_cancelled_leaves_no_cycle_with_its_holder() -> None:
    """A slot's callback is most often a method of the object that holds the slot
    (a lease's renewal): the slot lets go of it once run or cancelled, so each
    delivery's objects are freed by their count, not left to the collector."""
    loop = asyncio.get_running_loop()
    timers = shared_timers(loop)

    class Holder:
        def __init__(self) -> None:
            self.slot = timers.call_later(8.0, self.due)
            self.deadline = timers.call_no_sooner(8.0, self.due)

        def due(self) -> None:
            pass

    gc.collect()
    gc.disable()
    try:
        holders = [Holder() for _ in range(200)]
        for holder in holders:
            holder.slot.cancel()  # the common end: the delivery settles first
        # The deadlines come due: their slices run as the loop timer would run them.
        for name, slice_ in list(timers._slices.items()):
            if any(holder.deadline._slice is slice_ for holder in holders):
                timers._fire(name)
        del holders, holder
        assert gc.collect() < 20  # 200 holders in cycles: 1,000 and more
    finally:
        gc.enable()

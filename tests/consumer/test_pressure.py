"""The admission limit that follows the store's answer times (pure logic, no store)."""

from __future__ import annotations

import asyncio

import pytest

from semel.consumer.delivery.pressure import START, Pressure

pytestmark = pytest.mark.timeout(10)


async def settle(pressure: Pressure, deliveries: int) -> None:
    """``deliveries`` admitted and settled one after another, every answer quick."""
    for _ in range(deliveries):
        admitted_at = await pressure.admit()
        pressure.answered(0.0)
        pressure.leave(admitted_at)


async def test_the_limit_starts_low_and_grows_with_each_settled_delivery() -> None:
    seen: list[int] = []
    pressure = Pressure(ceiling=256, target=1.0, on_limit=seen.append)
    assert pressure.limit == START
    await settle(pressure, 300)
    assert pressure.limit == 256
    assert seen[:2] == [START, START + 1]


async def test_quick_claims_alone_do_not_raise_the_limit() -> None:
    pressure = Pressure(ceiling=256, target=1.0)
    for _ in range(100):
        pressure.answered(0.0)  # claims answered; their deliveries still running
    assert pressure.limit == START


async def test_a_slow_answer_halves_the_limit_once_per_target_period() -> None:
    seen: list[int] = []
    pressure = Pressure(ceiling=64, target=60.0, on_limit=seen.append)
    await settle(pressure, 12)
    assert pressure.limit == 16
    for _ in range(10):  # one slow batch answers many deliveries at once
        pressure.answered(61.0)
    assert pressure.limit == 8
    assert seen[-2:] == [16, 8]


async def test_a_delivery_admitted_before_a_cut_does_not_grow_the_limit() -> None:
    pressure = Pressure(ceiling=64, target=0.0001)
    admitted_at = await pressure.admit()
    pressure.answered(1.0)  # cut from START to half
    assert pressure.limit == START // 2
    pressure.leave(admitted_at)
    assert pressure.limit == START // 2


async def test_after_a_cut_the_limit_grows_by_one_per_limits_worth_of_deliveries() -> None:
    pressure = Pressure(ceiling=64, target=0.0001)
    pressure.answered(1.0)  # cut from 4 to 2
    assert pressure.limit == 2
    pressure.target = 10.0
    await settle(pressure, 2)
    assert pressure.limit == 3
    await settle(pressure, 3)
    assert pressure.limit == 4


async def test_never_past_the_ceiling() -> None:
    pressure = Pressure(ceiling=6, target=1.0)
    await settle(pressure, 50)
    assert pressure.limit == 6


async def test_deliveries_over_the_limit_wait_their_turn_in_order() -> None:
    pressure = Pressure(ceiling=2, target=1.0)
    first = await pressure.admit()
    second = await pressure.admit()
    order: list[int] = []

    async def later(n: int) -> None:
        await pressure.admit()
        order.append(n)

    waiting = [asyncio.create_task(later(n)) for n in range(3)]
    await asyncio.sleep(0)
    assert order == []
    assert pressure.admitted == 2
    pressure.leave(first)
    await asyncio.sleep(0)
    assert order == [0]
    pressure.leave(second)
    pressure.leave(0.0)  # the first of them settled too
    await asyncio.gather(*waiting)
    assert order == [0, 1, 2]


async def test_a_waiter_cancelled_leaves_no_place_taken() -> None:
    pressure = Pressure(ceiling=1, target=1.0)
    admitted_at = await pressure.admit()
    gone = asyncio.create_task(pressure.admit())
    await asyncio.sleep(0)
    gone.cancel()
    pressure.leave(admitted_at)  # wakes `gone` and cancels it in the same turn
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert pressure.admitted == 0
    await asyncio.wait_for(pressure.admit(), 1)  # the place was passed on
    assert pressure.admitted == 1


async def test_a_lowered_limit_holds_back_new_deliveries_until_enough_left() -> None:
    pressure = Pressure(ceiling=4, target=0.5)
    admitted = [await pressure.admit() for _ in range(4)]
    pressure.answered(1.0)  # limit 2, four still admitted
    blocked = asyncio.create_task(pressure.admit())
    await asyncio.sleep(0)
    pressure.leave(admitted[0])
    pressure.leave(admitted[1])
    await asyncio.sleep(0)
    assert not blocked.done()  # 2 admitted = the limit
    pressure.leave(admitted[2])
    await asyncio.wait_for(blocked, 1)

"""Which frames the ACK batching sends, with recording fakes in place of messages.

The broker-facing proof is the consumer suite (every ACK goes through it);
this pins the rule: one ``multiple`` ACK below the lowest open tag, single
ACKs above it, never a ``multiple`` ACK over a tag still open or being NACKed.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aio_pika.abc import AbstractIncomingMessage

from consumer.acks import Acks

pytestmark = pytest.mark.timeout(10)


class FakeMessage:
    def __init__(self, tag: int, channel: object, frames: list[tuple[str, int, bool]]) -> None:
        self.delivery_tag = tag
        self.channel = channel
        self._frames = frames

    async def ack(self, multiple: bool = False) -> None:
        self._frames.append(("ack", self.delivery_tag, multiple))

    async def nack(self, requeue: bool = True, multiple: bool = False) -> None:
        await asyncio.sleep(0.05)  # the frame is on its way for a while
        self._frames.append(("nack", self.delivery_tag, False))


def deliver(acks: Acks, tags: range, channel: object, frames: list[Any]) -> list[Any]:
    messages = [cast(AbstractIncomingMessage, FakeMessage(tag, channel, frames)) for tag in tags]
    for message in messages:
        acks.delivered(message)
    return messages


async def test_a_run_of_settled_tags_is_one_multiple_ack() -> None:
    acks, frames = Acks(), list[tuple[str, int, bool]]()
    m = deliver(acks, range(1, 6), object(), frames)
    await asyncio.gather(*(acks.ack(x) for x in m[:3]))
    assert frames == [("ack", 3, True)]
    await asyncio.gather(*(acks.ack(x) for x in m[3:]))
    assert frames == [("ack", 3, True), ("ack", 5, True)]


async def test_tags_above_an_open_one_are_acked_singly_at_once() -> None:
    acks, frames = Acks(), list[tuple[str, int, bool]]()
    m = deliver(acks, range(1, 6), object(), frames)
    await asyncio.gather(acks.ack(m[1]), acks.ack(m[2]), acks.ack(m[4]))
    assert sorted(frames) == [("ack", 2, False), ("ack", 3, False), ("ack", 5, False)]
    frames.clear()
    await acks.ack(m[0])  # everything below 4 is settled now: 1 alone
    assert frames == [("ack", 1, False)]


async def test_a_nack_in_flight_keeps_multiple_acks_below_it() -> None:
    acks, frames = Acks(), list[tuple[str, int, bool]]()
    m = deliver(acks, range(1, 5), object(), frames)
    await asyncio.gather(acks.nack(m[1], requeue=True), acks.ack(m[0]), acks.ack(m[2]))
    # While 2's NACK was on its way, 1 went alone and 3 singly: nothing covered 2.
    assert frames == [("ack", 1, False), ("ack", 3, False), ("nack", 2, False)]
    await acks.ack(m[3])
    assert frames[-1] == ("ack", 4, False)  # 1..3 are settled: 4 alone


async def test_a_new_channel_starts_afresh() -> None:
    acks, frames = Acks(), list[tuple[str, int, bool]]()
    old = deliver(acks, range(1, 4), object(), frames)
    new = deliver(acks, range(1, 3), object(), frames)
    await acks.ack(old[2])  # the old channel is gone: sent as it is, alone
    await asyncio.gather(*(acks.ack(x) for x in new))
    assert frames == [("ack", 3, False), ("ack", 2, True)]

"""Coalesced settlements: never an ACK for a delivery not settled, every settlement
sent, in as few frames as a turn of the loop allows. The frames are checked
against a model of the broker's unacked set; test_intake.py checks them on the
real broker."""

from __future__ import annotations

import asyncio
import random

import pytest
from aiormq.exceptions import ChannelInvalidStateError

from semel.consumer.broker.acks import How, Settlements

pytestmark = pytest.mark.timeout(60)


class ModelChannel:
    """The broker's side of one channel: which tags are unacked, and what each got."""

    def __init__(self) -> None:
        self.is_closed = False
        self.unacked: set[int] = set()
        self.got: dict[int, str] = {}
        self.frames = 0

    def deliver(self, tag: int) -> None:
        self.unacked.add(tag)

    async def basic_ack(self, tag: int, *, multiple: bool, wait: bool) -> None:
        self.frames += 1
        for t in [t for t in self.unacked if t <= tag] if multiple else [tag]:
            assert t in self.unacked, f"ack of {t}, not unacked"
            self.unacked.discard(t)
            self.got[t] = "ack"

    async def basic_nack(self, tag: int, *, multiple: bool, requeue: bool, wait: bool) -> None:
        assert not multiple
        self.frames += 1
        assert tag in self.unacked, f"nack of {tag}, not unacked"
        self.unacked.discard(tag)
        self.got[tag] = "requeue" if requeue else "drop"


HOW = {"ack": How.ACK, "requeue": How.REQUEUE, "drop": How.DROP}


async def _turn() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.mark.parametrize("seed", range(20))
async def test_each_delivery_gets_exactly_what_it_was_settled_with(seed: int) -> None:
    rng = random.Random(seed)
    channel = ModelChannel()
    settlements = Settlements(channel)  # type: ignore[arg-type]
    tags = list(range(1, 301))
    wanted = {t: rng.choice(["ack"] * 8 + ["requeue", "drop"]) for t in tags}
    open_: list[int] = []
    settled: set[int] = set()
    for tag in tags:
        channel.deliver(tag)
        settlements.delivered(tag)
        open_.append(tag)
        # Settle some of what is open, out of order, a few per turn.
        if rng.random() < 0.5:
            for t in rng.sample(open_, min(len(open_), rng.randint(1, 4))):
                settlements.settle(t, HOW[wanted[t]])
                settled.add(t)
                open_.remove(t)
        if rng.random() < 0.3:
            await _turn()
            # No frame ever reached a delivery before it was settled.
            assert set(channel.got) <= settled
    for t in open_:
        settlements.settle(t, HOW[wanted[t]])
    await settlements.sent()
    assert channel.got == wanted
    assert channel.unacked == set()
    assert channel.frames < len(tags)  # some ACKs went together


async def test_a_run_of_acks_in_one_turn_is_one_frame() -> None:
    channel = ModelChannel()
    settlements = Settlements(channel)  # type: ignore[arg-type]
    for tag in range(1, 101):
        channel.deliver(tag)
        settlements.delivered(tag)
    for tag in range(1, 101):
        settlements.settle(tag, How.ACK)
    await settlements.sent()
    assert channel.frames == 1
    assert channel.unacked == set()


async def test_a_delivery_never_seen_stops_every_multiple_ack() -> None:
    channel = ModelChannel()
    settlements = Settlements(channel)  # type: ignore[arg-type]
    for tag in range(1, 11):
        channel.deliver(tag)
    for tag in (1, 2, 3, 5, 6, 7, 8, 9, 10):  # tag 4 went to no one here
        settlements.delivered(tag)
        settlements.settle(tag, How.ACK)
    await settlements.sent()
    assert channel.unacked == {4}  # a multiple ACK would have taken it
    assert channel.frames == 9


async def test_a_settlement_on_a_closed_channel_is_refused_at_once() -> None:
    channel = ModelChannel()
    settlements = Settlements(channel)  # type: ignore[arg-type]
    settlements.delivered(1)
    channel.is_closed = True
    with pytest.raises(ChannelInvalidStateError):
        settlements.settle(1, How.ACK)


async def test_a_flush_whose_channel_broke_is_logged_not_raised() -> None:
    class Broken(ModelChannel):
        async def basic_ack(self, tag: int, *, multiple: bool, wait: bool) -> None:
            raise ChannelInvalidStateError("closed under the flush")

    settlements = Settlements(Broken())  # type: ignore[arg-type]
    settlements.delivered(1)
    settlements.settle(1, How.ACK)
    await settlements.sent()  # no exception: the broker takes the delivery back

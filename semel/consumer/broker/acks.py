"""Settlements of one channel's deliveries, sent as few frames as the broker allows.

A worker settles each delivery by a frame of its own, and each frame costs a
write, a wake of aiormq's writer and a future awaited by the settling task.
Here a settlement is recorded at once and sent by one flush per turn of the
event loop: a run of ACKs at the front of the channel's deliveries goes as one
``basic.ack`` with ``multiple``, the rest one frame each.

``multiple`` acks every unsettled tag up to its own, so it is sent only over
tags this object has seen delivered, one by one from the channel's first, and
seen settled; one unseen tag (a delivery this object was not told of) and the
channel is settled frame by frame from then on. A NACK is never folded into
an ACK: the flush sends the frames in tag order, one flush at a time.

Nothing is lost by the wait of one loop turn: an ACK not yet sent when the
channel or the process dies is a delivery the broker hands out again, which
the store recognises, exactly as an ACK lost on the wire.
"""

from __future__ import annotations

import asyncio
from collections import deque
from enum import IntEnum

import structlog
from aiormq.abc import AbstractChannel
from aiormq.exceptions import ChannelInvalidStateError

from semel.consumer.broker.publishing import BROKER_TROUBLE

log = structlog.get_logger("semel.acks")


class How(IntEnum):
    ACK = 0
    REQUEUE = 1
    DROP = 2
    SENT = 3  # sent on its own, ahead of older deliveries still open


class Settlements:
    """The settled, unsent deliveries of one AMQP channel."""

    __slots__ = (
        "_channel", "_fresh", "_last", "_lock", "_open", "_seen_upto", "_sending", "_states",
    )  # fmt: skip

    def __init__(self, channel: AbstractChannel) -> None:
        self._channel = channel
        self._open: deque[int] = deque()  # delivered tags the broker may still hold, in order
        self._states: dict[int, How] = {}  # of open tags settled here
        self._fresh: list[int] = []  # settled since the last flush took its share
        self._seen_upto = 0  # every tag up to it was seen delivered; -1 once one was missed
        self._lock = asyncio.Lock()
        self._sending: asyncio.Task[None] | None = None  # a flush not yet under way
        self._last: asyncio.Task[None] | None = None  # the newest flush: the others ended first

    @property
    def channel(self) -> AbstractChannel:
        return self._channel

    def delivered(self, tag: int) -> None:
        """Record a delivery, in the order of the channel's tags."""
        if self._seen_upto >= 0:
            self._seen_upto = tag if tag == self._seen_upto + 1 else -1
        self._open.append(tag)

    def settle(self, tag: int, how: How) -> None:
        """Send ``how`` for ``tag`` at the end of this loop turn."""
        if self._channel.is_closed:
            raise ChannelInvalidStateError(f"{self._channel!r} closed")
        self._states[tag] = how
        self._fresh.append(tag)
        if self._sending is None:
            self._sending = self._last = asyncio.get_running_loop().create_task(self._flush())
            self._sending.add_done_callback(_quiet)

    async def sent(self) -> None:
        """Wait until every settlement recorded so far has been handed to the connection."""
        # Flushes take the lock in the order they were made: the newest ends last.
        while (last := self._last) is not None and not last.done():
            await asyncio.shield(last)

    async def _flush(self) -> None:
        # One flush at a time: a later one's ``multiple`` must never overtake an
        # earlier one's NACK of a lower tag.
        async with self._lock:
            self._sending = None  # what is settled from here on takes the next flush
            frames = self._take()
            try:
                for how, tag, multiple in frames:
                    if how is How.ACK:
                        await self._channel.basic_ack(tag, multiple=multiple, wait=False)
                    else:
                        await self._channel.basic_nack(
                            tag, multiple=False, requeue=how is How.REQUEUE, wait=False
                        )
            except BROKER_TROUBLE as exc:
                # The channel is gone, and the broker takes back what it held.
                log.warning("settlements not sent, left for redelivery", error=repr(exc))

    def _take(self) -> list[tuple[How, int, bool]]:
        """The frames for what was settled: the front of the open tags first,
        ACKs there folded into one, then each settled tag behind an open one."""
        frames: list[tuple[How, int, bool]] = []
        open_, states = self._open, self._states
        run: list[int] = []  # ACKs at the front not yet put in a frame
        while open_ and (how := states.get(open_[0])) is not None:
            tag = open_.popleft()
            del states[tag]
            if how is How.ACK:
                run.append(tag)
            elif how is not How.SENT:
                frames.extend(self._acks(run))
                run = []
                frames.append((how, tag, False))
        frames.extend(self._acks(run))
        for tag in self._fresh:
            how = states.get(tag)
            if how is not None and how is not How.SENT:
                frames.append((how, tag, False))
                states[tag] = How.SENT
        self._fresh = []
        return frames

    def _acks(self, run: list[int]) -> list[tuple[How, int, bool]]:
        if len(run) > 1 and 0 < run[-1] <= self._seen_upto:
            return [(How.ACK, run[-1], True)]
        return [(How.ACK, tag, False) for tag in run]


def _quiet(task: asyncio.Task[None]) -> None:
    # A flush cut short by the loop's end has nothing left to report.
    if not task.cancelled():
        task.exception()

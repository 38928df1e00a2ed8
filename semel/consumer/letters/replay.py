"""``semel dlq replay``: dead letters sent back, each ended only once its copy was confirmed.

Nothing is taken out of the stream. A replay publishes a copy of each chosen
letter, and once the broker confirmed a batch of copies it appends one
``replayed`` event naming their letters, which ends them for every later
reading. So a replay stopped at any point has lost nothing: a letter whose
copy was not confirmed (returned, nacked, or no answer) is still live and
counted as failed; a letter whose copy was confirmed but whose event was never
written (the run killed between the two) replays again next time, a
duplicate the store answers.

Where a copy goes: the exchange and routing key the producer first used
(``x-semel-original-exchange``, ``x-semel-original-routing-key``), so it
reaches the queues that route picks as the first message did; the work queue,
through the default exchange, when the letter came through the default
exchange or names no route; or ``to``, a queue, through the default exchange.
Every copy is mandatory: one that no queue takes comes back and fails. An
exchange that no longer exists is looked for first (publishing to it would
close the channel under every copy in flight): its letters fail unsent.

A copy carries the producer's headers whole (decoded from ``x-semel-headers``:
the stream keeps only their scalars as themselves), the producer's route, and
``x-semel-replays``, one more than the letter had; attempts, reason and error
start afresh. Before its copy is sent, a letter whose reason left the key's
failure in the store (``RESET_REASONS``) has its key reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange

from semel.consumer.broker.dead_letters import RESET_REASONS, Chooser, replay_headers
from semel.consumer.broker.publishing import BROKER_TROUBLE, Published, publish_confirmed
from semel.consumer.letters.admin import operator
from semel.consumer.letters.log import Event, Letter, LogState, append_event, read_log
from semel.consumer.letters.reading import Destination, destination_of, exists, listing
from semel.consumer.letters.writing import carry_forward, writer_lock
from semel.consumer.names import (
    BROKER_CALL_TIMEOUT,
    DEFAULT_EXCHANGE,
    H_ORIGINAL_EXCHANGE,
    H_ORIGINAL_ROUTING_KEY,
    H_REPLAYS,
    Topology,
)

REPLAY_WINDOW = 100  # copies awaiting their confirm at most; their event follows them

Reset = Callable[[str], Awaitable[bool]]


def copy_headers(letter: Letter) -> dict[str, Any]:
    """The producer's headers whole, the producer's route, and the replay counted."""
    route = {
        name: letter.headers[name]
        for name in (H_ORIGINAL_EXCHANGE, H_ORIGINAL_ROUTING_KEY)
        if name in letter.headers
    }
    headers = replay_headers(letter.producer_headers() | route)
    headers[H_REPLAYS] = letter.entry.replays + 1
    return headers


class Pace:
    """A token bucket of one token: at most ``rate`` copies a second, never a burst,
    so N copies take at least (N - 1) / rate seconds. ``None``: no pacing."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._next = 0.0

    async def take(self) -> None:
        if self.rate is None:
            return
        now = time.monotonic()
        self._next = max(self._next, now)
        wait = self._next - now
        self._next += 1.0 / self.rate
        if wait > 0:
            await asyncio.sleep(wait)


def window_of(rate: float | None) -> int:
    """Copies per batch: the window, or about a second's worth when paced, so a slow
    replay records what it sent as it goes."""
    return REPLAY_WINDOW if rate is None else max(1, min(REPLAY_WINDOW, math.ceil(rate)))


@dataclass(slots=True)
class ReplayReport:
    replayed: int = 0
    kept: int = 0  # live letters not chosen
    failed: int = 0  # chosen, no confirmed copy: still live
    reset: int = 0  # keys reset in the store
    archived: int = 0  # archived letters the filters match: left alone
    missing: list[str] = field(default_factory=list)  # exchanges not found: their letters failed
    stopped: str | None = None  # the broker trouble that ended the run early

    def summary(self) -> str:
        text = f"replayed {self.replayed}, kept {self.kept}"
        text += f", failed {self.failed}" if self.failed else ""
        text += f", {self.archived} archived left alone" if self.archived else ""
        text += "".join(f"; exchange {name!r} not found" for name in self.missing)
        return text + (f"; stopped: {self.stopped}" if self.stopped else "")


class _Run:
    """One replay's copies in flight, their events, and its counts."""

    def __init__(
        self,
        connection: AbstractConnection,
        names: Topology,
        state: LogState,
        channels: tuple[AbstractChannel, AbstractChannel],
        reset: Reset,
        report: ReplayReport,
        *,
        rate: float | None,
        by: str,
    ) -> None:
        self.connection, self.names, self.state = connection, names, state
        self.copies, self.events = channels
        self.reset, self.report, self.by = reset, report, by
        self.pace, self.window = Pace(rate), window_of(rate)
        self.flight: list[tuple[Letter, asyncio.Task[Published]]] = []
        self.exchanges: dict[str, AbstractExchange | None] = {}

    async def exchange(self, destination: Destination) -> AbstractExchange | None:
        """The destination's exchange; ``None`` when it does not exist."""
        name = destination.exchange
        if name == DEFAULT_EXCHANGE:
            return self.copies.default_exchange
        if name not in self.exchanges:
            found = await exists(self.connection, destination)
            self.exchanges[name] = (
                await self.copies.get_exchange(name, ensure=False) if found else None
            )
            if not found:
                self.report.missing.append(name)
        return self.exchanges[name]

    async def send(self, letters: Iterable[tuple[Letter, Destination]]) -> None:
        try:
            for letter, destination in letters:
                exchange = await self.exchange(destination)
                if exchange is None:
                    self.report.failed += 1
                    continue
                await self.pace.take()
                entry = letter.entry
                if entry.key is not None and entry.reason in RESET_REASONS:
                    self.report.reset += int(await self.reset(entry.key))
                copy = letter.message(copy_headers(letter))
                publish = publish_confirmed(exchange, copy, destination.routing_key)
                self.flight.append((letter, asyncio.ensure_future(publish)))
                if len(self.flight) >= self.window:
                    await self.settle()
        except BaseException:
            # What was confirmed before the trouble is recorded as replayed.
            with contextlib.suppress(Exception):
                await self.settle()
            raise

    async def settle(self) -> None:
        """Await the copies in flight; record the confirmed ones in one event."""
        flight, self.flight = self.flight, []
        answers = await asyncio.gather(*(task for _, task in flight), return_exceptions=True)
        confirmed = [
            letter.letter_id
            for (letter, _), answer in zip(flight, answers, strict=True)
            if answer is Published.CONFIRMED
        ]
        self.report.failed += len(flight) - len(confirmed)
        if confirmed:
            await append_event(self.events, self.names, Event.REPLAYED, confirmed, by=self.by)
            self.report.replayed += len(confirmed)
            for letter_id in confirmed:  # ended: never carried forward
                del self.state.letters[letter_id]
        trouble = next((a for a in answers if isinstance(a, BaseException)), None)
        if trouble is not None:
            raise trouble


async def replay(
    connection: AbstractConnection,
    names: Topology,
    chooser: Chooser,
    reset: Reset,
    *,
    to: str | None = None,
    rate: float | None = None,
    archive_retention: timedelta | None = None,
    by: str | None = None,
) -> ReplayReport:
    """Send the live letters ``chooser`` picks back, each ended once its copy was confirmed.

    Holds the writers' lock for the run (raises :class:`~semel.consumer.letters.log.
    LogBusy` when another command holds it), reads under it, and carries the
    letters still there forward at its end. Broker trouble on the copies'
    channel stops the run: the letters not replayed are counted failed and the
    report says why. A store that fails a reset raises, after the copies
    already in flight were settled.
    """
    async with writer_lock(connection, names):
        state = await read_log(connection, names, archive_retention=archive_retention)
        pick = listing(state, chooser)
        report = ReplayReport(kept=pick.live - len(pick.matched), archived=pick.others)
        async with _channel(connection, returns=True) as copies, _channel(connection) as events:
            run = _Run(
                connection,
                names,
                state,
                (copies, events),
                reset,
                report,
                rate=rate,
                by=by or operator(),
            )
            routed = [(letter, destination_of(letter, names.queue, to)) for letter in pick.matched]
            try:
                await run.send(routed)
                await run.settle()
            except BROKER_TROUBLE as exc:
                if events.is_closed:
                    raise  # nothing can be recorded: the command's own error says why
                report.failed = len(routed) - report.replayed
                report.stopped = f"{type(exc).__name__}: {exc}"
                return report
            await carry_forward(events, names, state)
    return report


@contextlib.asynccontextmanager
async def _channel(
    connection: AbstractConnection, *, returns: bool = False
) -> AsyncIterator[AbstractChannel]:
    """A publisher-confirm channel of its own: the broker closing the copies' channel
    (an exchange deleted midway) must leave the events' channel able to record."""
    channel = await connection.channel(publisher_confirms=True, on_return_raises=returns)
    try:
        yield channel
    finally:
        if not channel.is_closed:
            with contextlib.suppress(*BROKER_TROUBLE):
                await asyncio.wait_for(channel.close(), BROKER_CALL_TIMEOUT)

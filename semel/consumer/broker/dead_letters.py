"""Looking at and replaying the dead letters in ``Q.dlq``.

Nothing leaves the DLQ unless its replayed copy was confirmed by the broker.
Dead letters are fetched with ``basic.get`` and manual acks and held
unacknowledged while the run lasts, so none is seen twice; those not removed
are handed back at the end with one ``basic.nack(requeue=True)``.

Every hand-back is a return, and RabbitMQ 4.0 to 4.2 count each one (nack,
reject or a closed channel alike) against a quorum queue's delivery limit,
20 by default; ``Q.dlq`` has nowhere to dead-letter to, so about 21 listings
would silently drop every dead letter. A dead letter already returned
``RETURNS_BEFORE_DETOUR`` times is therefore not handed back but refreshed:
a confirmed copy goes to the tail of ``Q.dlq`` and the original is acked, so
its count starts again at 0. Nothing about the DLQ's declaration changes,
so queues declared by earlier versions need nothing done to them.

Ordering caveat: a requeued message goes back near the head of the queue, so
dead letters that arrived while a listing or replay was running may end up
behind the ones it handed back. A run reads at most the depth it saw at the
start, so a replayed message that fails again is not picked up a second time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from aiormq.exceptions import AMQPError, ChannelInvalidStateError

from semel.consumer import names
from semel.consumer.broker.copies import carried_headers, copy_message, fresh_copy
from semel.consumer.broker.publishing import BROKER_TROUBLE, Published, publish_confirmed
from semel.consumer.names import (
    BROKER_CALL_TIMEOUT,
    RETURNS_BEFORE_DETOUR,
    Reason,
    Topology,
    returns,
)

# Only these reasons mean the store holds this message's failure. The others
# wrote nothing for the key, and resetting it could wipe another message's
# completed record (a too-large copy of a key that already ran, a key reuse).
RESET_REASONS = frozenset({Reason.MAX_ATTEMPTS, Reason.PERMANENT_ERROR, Reason.POISON})


@dataclass(frozen=True, slots=True)
class DlqEntry:
    """What the DLQ headers say about one dead letter (the message, not the decision)."""

    reason: str | None
    key: str | None
    attempts: int | None
    error: str | None
    dead_lettered_at: datetime | None
    routing_key: str | None  # the routing key it was first published with
    message_id: str | None
    # The handler's exception, for max-attempts and permanent-error: its qualified
    # type and the handler's own frame (module:function:line). Grouping and
    # filters: semel.consumer.broker.letter_filters.
    error_type: str | None = None
    error_frame: str | None = None

    def age(self, now: datetime) -> timedelta | None:
        return None if self.dead_lettered_at is None else now - self.dead_lettered_at

    def as_json(self, now: datetime) -> dict[str, Any]:
        age = self.age(now)
        return {
            "reason": self.reason,
            "key": self.key,
            "attempts": self.attempts,
            "error": self.error,
            "dead_lettered_at": self.dead_lettered_at and self.dead_lettered_at.isoformat(),
            "age_seconds": None if age is None else round(age.total_seconds(), 3),
            "routing_key": self.routing_key,
            "message_id": self.message_id,
            "error_type": self.error_type,
            "error_frame": self.error_frame,
        }


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _int(value: object) -> int | None:
    try:
        return int(str(_text(value)))
    except ValueError:
        return None


def parse_instant(value: object) -> datetime | None:
    """A header timestamp as an aware datetime: AMQP timestamp, epoch or ISO 8601."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = value / 1000 if value > 1e11 else value  # epoch milliseconds
        try:
            return datetime.fromtimestamp(seconds, UTC)
        except (ValueError, OverflowError, OSError):
            return None
    text = _text(value)
    if not text:
        return None
    try:
        return parse_instant(float(text))
    except ValueError:
        pass
    try:
        return parse_instant(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        return None


def read_entry(message: AbstractIncomingMessage) -> DlqEntry:
    """Read the ``x-semel-*`` headers of a message taken from the DLQ."""
    headers = message.headers or {}
    return DlqEntry(
        reason=_text(headers.get(names.H_REASON)),
        key=_text(headers.get(names.H_KEY)) or None,  # "" when the key was missing
        attempts=_int(headers.get(names.H_ATTEMPTS)),
        error=_text(headers.get(names.H_ERROR)),
        dead_lettered_at=parse_instant(headers.get(names.H_DEAD_LETTERED_AT)),
        routing_key=_text(headers.get(names.H_ORIGINAL_ROUTING_KEY)) or message.routing_key,
        message_id=message.message_id,
        error_type=_text(headers.get(names.H_ERROR_TYPE)) or None,
        error_frame=_text(headers.get(names.H_ERROR_FRAME)) or None,
    )


# Kept on a replayed copy: the producer's route. It goes to the work queue
# through the default exchange, so without them its route would be the queue's
# name, which no handler of an app's queue takes (dead-lettered again as
# no-handler), and a later dead letter would name the default exchange.
_ROUTE_HEADERS = (names.H_ORIGINAL_EXCHANGE, names.H_ORIGINAL_ROUTING_KEY)


def replay_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The headers without semel's retry/DLQ headers (but the producer's route) and the
    broker's death records."""
    return {
        name: value
        for name, value in carried_headers(headers).items()
        if not name.startswith(names.SEMEL_HEADER_PREFIX) or name in _ROUTE_HEADERS
    }


def replay_copy(message: AbstractIncomingMessage) -> aio_pika.Message:
    """A fresh, persistent copy of a dead letter with its original properties.

    Built like every copy semel makes (:func:`semel.consumer.broker.copies.copy_message`):
    ``user_id`` and ``expiration`` are left out.
    """
    return copy_message(message, replay_headers(message.headers or {}))


class Chooser(Protocol):
    """Which dead letters a replay takes: a :class:`Selection`, or any filter
    (:class:`semel.consumer.broker.letter_filters.LetterFilter`)."""

    def matches(self, entry: DlqEntry) -> bool: ...


@dataclass(frozen=True, slots=True)
class Selection:
    """One key, one reason, or all (the filters' first form, kept for its callers)."""

    key: str | None = None
    reason: Reason | None = None
    everything: bool = False

    def matches(self, entry: DlqEntry) -> bool:
        if self.everything:
            return True
        if self.key is not None:
            return entry.key == self.key
        return self.reason is not None and entry.reason == self.reason.value


async def _fetch(channel: AbstractChannel, dead_letter_queue: str, limit: int | None) -> _Batch:
    queue = await channel.declare_queue(dead_letter_queue, passive=True)
    depth = queue.declaration_result.message_count or 0
    batch = _Batch(depth)
    wanted = depth if limit is None else min(depth, limit)
    while len(batch.fetched) < wanted:
        message = await queue.get(no_ack=False, fail=False, timeout=BROKER_CALL_TIMEOUT)
        if message is None:
            break
        batch.fetched.append(message)
    return batch


@dataclass(slots=True)
class _Batch:
    depth: int  # messages in the DLQ when the run started
    fetched: list[AbstractIncomingMessage] = field(default_factory=list)


async def _hand_back(
    channel: AbstractChannel, queue: str, messages: list[AbstractIncomingMessage]
) -> None:
    """Return what was fetched and not acked; refresh what came back too often."""
    if not messages:
        return
    # A channel that is gone already had the broker requeue all its unacked messages.
    with contextlib.suppress(AMQPError, ChannelInvalidStateError):
        kept = [m for m in messages if not await _refreshed(channel, queue, m)]
        if kept:
            # Everything still unacked was fetched on this channel; one nack returns it all.
            await kept[-1].nack(multiple=True, requeue=True)


async def _refreshed(
    channel: AbstractChannel, queue: str, message: AbstractIncomingMessage
) -> bool:
    """Whether ``message`` was replaced by a confirmed copy at the queue's tail."""
    if returns(message.headers or {}) + 1 < RETURNS_BEFORE_DETOUR:
        return False
    copy = fresh_copy(message)
    try:
        answer = await publish_confirmed(channel.default_exchange, copy, queue)
    except BROKER_TROUBLE:
        return False  # handed back as it is: one more return, still far from the limit
    if answer is not Published.CONFIRMED:
        return False
    await message.ack()
    return True


@dataclass(frozen=True, slots=True)
class Listing:
    depth: int
    letters: list[DlqEntry]


async def list_dead_letters(
    channel: AbstractChannel, topology: Topology, limit: int | None = None
) -> Listing:
    """The first ``limit`` dead letters, leaving every one of them in the DLQ."""
    batch = await _fetch(channel, topology.dead_letter_queue, limit)
    try:
        return Listing(batch.depth, [read_entry(m) for m in batch.fetched])
    finally:
        await _hand_back(channel, topology.dead_letter_queue, batch.fetched)


@dataclass(slots=True)
class ReplayReport:
    replayed: int = 0
    kept: int = 0  # not selected, left in the DLQ
    failed: int = 0  # selected, but the copy was not confirmed; left in the DLQ
    reset: int = 0  # keys reset in the store

    def summary(self) -> str:
        text = f"replayed {self.replayed}, kept {self.kept}"
        return text + (f", failed {self.failed}" if self.failed else "")


Reset = Callable[[str], Awaitable[bool]]


async def replay(
    channel: AbstractChannel, topology: Topology, selection: Chooser, reset: Reset
) -> ReplayReport:
    """Re-publish the selected dead letters to the work queue, then remove them.

    For each one: reset its key (when its reason left state in the store),
    publish a copy to the work queue through the default exchange, and only
    once the broker confirmed the copy, ack the dead letter. ``channel`` must
    have publisher confirms.

    A reset takes only a failed key (:meth:`semel.stores.base.Store.reset`): the
    second dead letter of a key whose first copy already completed, or a
    replay run again after its copy completed, replays a duplicate.
    """
    report = ReplayReport()
    batch = await _fetch(channel, topology.dead_letter_queue, None)
    try:
        for message in batch.fetched:
            letter = read_entry(message)
            if not selection.matches(letter):
                report.kept += 1
                continue
            if letter.key is not None and letter.reason in RESET_REASONS:
                report.reset += int(await reset(letter.key))
            if await _republish(channel, topology.queue, message):
                await message.ack()
                report.replayed += 1
            else:
                report.failed += 1
    finally:
        # On an error midway, the dead letters not yet acked are all handed back.
        kept = [m for m in batch.fetched if not m.processed]
        await _hand_back(channel, topology.dead_letter_queue, kept)
    return report


async def _republish(
    channel: AbstractChannel, work_queue: str, message: AbstractIncomingMessage
) -> bool:
    """Whether the broker confirmed a copy sent straight to the work queue.

    A returned or nacked copy is a failed replay that leaves the dead letter
    where it is; no answer at all raises, and the run stops.
    """
    answer = await publish_confirmed(channel.default_exchange, replay_copy(message), work_queue)
    return answer is Published.CONFIRMED

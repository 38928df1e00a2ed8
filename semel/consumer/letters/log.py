"""The dead letters' home: the stream ``Q.dead-letters``, read by offset, never taken from.

Why a stream: a queue can only be read by taking its messages, so listing
100,000 dead letters meant holding all of them unacknowledged for the run and
handing them back (reordered, and on RabbitMQ 4 each hand-back wears a
delivery-limit count). A stream is read from its first offset by any number
of readers at once, holds nothing, and is never reordered.

A stream cannot lose one record, so nothing is ever removed from it. It holds
two kinds of record:

- **letters**: a dead letter as a worker published it through ``Q.dlx``, or a
  copy of one carried forward (``x-semel-carried-at``), or an edited letter
  imported by an operator (``x-semel-edited-from``). Each has its id
  (``x-semel-letter-id``); all copies of one letter share it.
- **events** (``x-semel-dlq-event``): what an operator did to letters, by id:
  ``replayed``, ``discarded`` and ``edited`` end a letter for good,
  ``archived`` and ``unarchived`` hide and show it; and a reader's ``mark``.

A reader appends a ``mark`` and reads from the first offset until it meets
its mark: a stream cannot say how many records it holds, and everything
before the mark is everything confirmed before the reading began.

Retention: the stream drops whole segments once they are older than its max
age (28 days, ``topology.DEAD_LETTER_LOG_ARGS``). :func:`carry_forward`
copies a letter still live or archived once its newest copy is a week old,
so only what is ended (and archived letters past their retention) goes. Copies
are appended only under the writers' lock (:func:`writer_lock`), after reading
under it, so no copy ever follows the event that ended its letter; an ended
letter's copies are therefore all older than that event and go first.

Durability: a stream confirms a record once a majority of its replicas has
written it, but does not fsync; a quorum queue does. On a one-node broker a
power cut seconds after a dead letter was confirmed can lose it (a broker
crash cannot). The README's guarantees say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from semel.consumer.broker.dead_letters import DlqEntry, entry_of, parse_instant
from semel.consumer.broker.header_codec import decode_headers, encode_headers
from semel.consumer.broker.publishing import Published, publish_confirmed
from semel.consumer.errors import SemelError
from semel.consumer.names import (
    BROKER_CALL_TIMEOUT,
    H_CARRIED_AT,
    H_DEAD_LETTERED_AT,
    H_DLQ_EVENT,
    H_HEADERS,
    H_LETTER_ID,
    SEMEL_HEADER_PREFIX,
    Topology,
)

STREAM_OFFSET = "x-stream-offset"  # the broker's header on a record read from a stream
IDS_PER_EVENT = 1000  # letter ids named by one event record
READ_PREFETCH = 1000  # records a reader holds unacknowledged at most
_ACK_EVERY = 250
READ_IDLE_TIMEOUT = 30.0  # seconds without a record before a reading gives up
APPEND_WINDOW = 100  # records in flight, awaiting their confirm


class Event(StrEnum):
    MARK = "mark"
    REPLAYED = "replayed"
    DISCARDED = "discarded"
    EDITED = "edited"
    ARCHIVED = "archived"
    UNARCHIVED = "unarchived"


ENDING_EVENTS = frozenset({Event.REPLAYED, Event.DISCARDED, Event.EDITED})

# The properties a letter's record keeps, as aio_pika.Message takes them (user_id
# and expiration are dropped by every copy semel makes; see broker.copies).
PROPERTIES = (
    "content_type",
    "content_encoding",
    "priority",
    "correlation_id",
    "reply_to",
    "message_id",
    "timestamp",
    "type",
    "app_id",
)


class LogError(SemelError):
    """The dead letters' stream could not be read or written."""


@dataclass(slots=True)
class Letter:
    """One dead letter, as its newest copy in the stream says."""

    letter_id: str
    entry: DlqEntry
    body: bytes
    properties: dict[str, Any]
    headers: dict[str, Any]  # the record's headers, in their stream-safe form
    offset: int  # of its first record
    written_at: datetime  # when its newest copy was written
    archived_at: datetime | None = None

    @property
    def archived(self) -> bool:
        return self.archived_at is not None

    def producer_headers(self) -> dict[str, Any]:
        """The producer's headers, whole (tables, arrays and decimals included)."""
        if H_HEADERS in self.headers:
            value = self.headers[H_HEADERS]
            return decode_headers(value.decode() if isinstance(value, bytes) else value)
        return {k: v for k, v in self.headers.items() if not k.startswith(SEMEL_HEADER_PREFIX)}

    def semel_headers(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in self.headers.items()
            if k.startswith(SEMEL_HEADER_PREFIX) and k != H_HEADERS
        }

    def message(self, headers: Mapping[str, Any]) -> aio_pika.Message:
        """A persistent message with this letter's body and properties and ``headers``."""
        return aio_pika.Message(
            body=self.body,
            headers=dict(headers),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            **self.properties,
        )


@dataclass(slots=True, repr=False)
class LogState:
    """The stream folded: its letters still there, and what it held besides."""

    # Short on purpose: asyncio puts the repr of a task's result in its own repr,
    # and the generated one of 100,000 letters took 300 MiB to build.
    def __repr__(self) -> str:
        return f"LogState({len(self.letters)} letters, {self.records} records, {self.ended} ended)"

    letters: dict[str, Letter] = field(default_factory=dict)  # stream order
    records: int = 0  # read before the mark
    ended: int = 0  # letters replayed, discarded, edited or past their archive retention

    def live(self) -> list[Letter]:
        return [letter for letter in self.letters.values() if not letter.archived]

    def archived(self) -> list[Letter]:
        return [letter for letter in self.letters.values() if letter.archived]


def content_id(body: bytes, headers: Mapping[str, Any], message_id: str | None) -> str:
    """The id of a letter that has none (an earlier version's ``Q.dlq``): the same
    letter moved twice gets the same id, so a reader keeps it once."""
    digest = hashlib.sha256()
    digest.update(body)
    digest.update(encode_headers(dict(sorted(headers.items()))).encode())
    digest.update((message_id or "").encode())
    return digest.hexdigest()[:32]


def _at(value: object) -> datetime | None:
    return parse_instant(value)


_SHARED_VALUE_LENGTH = 64


def _compact(headers: Mapping[str, Any]) -> dict[str, Any]:
    """A record's headers, their names and short text values shared between letters.

    A reading holds every letter of the stream at once; most of their header
    names and many values (a reason, an exchange, an error type) are the same
    text, and sharing it roughly halves what 100,000 letters take.
    """
    return {
        sys.intern(name): sys.intern(value)
        if isinstance(value, str) and len(value) <= _SHARED_VALUE_LENGTH
        else value
        for name, value in headers.items()
    }


class _Fold:
    """Records in stream order in, :class:`LogState` out."""

    def __init__(self, mark: str) -> None:
        self.mark = mark
        self.state = LogState()
        self.ended_ids: set[str] = set()
        self.archived: dict[str, datetime] = {}

    def add(self, message: AbstractIncomingMessage) -> bool:
        """Fold one record; whether it was this reading's mark (the end)."""
        headers = _compact(message.headers or {})
        offset = headers.pop(STREAM_OFFSET, 0)
        event = headers.get(H_DLQ_EVENT)
        if event is not None:
            return self._event(str(event.decode() if isinstance(event, bytes) else event), message)
        self.state.records += 1
        given = headers.get(H_LETTER_ID)
        letter_id = given.decode() if isinstance(given, bytes) else str(given or "")
        if not letter_id:
            letter_id = content_id(message.body, headers, message.message_id)
        if letter_id in self.ended_ids:
            return False
        written = _at(headers.get(H_CARRIED_AT)) or _at(headers.get(H_DEAD_LETTERED_AT))
        written = written or datetime.now(UTC)
        known = self.state.letters.get(letter_id)
        if known is not None:
            known.written_at = max(known.written_at, written)
            return False
        properties = {
            name: value for name in PROPERTIES if (value := getattr(message, name)) is not None
        }
        self.state.letters[letter_id] = Letter(
            letter_id=letter_id,
            entry=entry_of(headers, message.routing_key, message.message_id, letter_id),
            body=message.body,
            properties=properties,
            headers=headers,
            offset=int(offset) if isinstance(offset, int) else 0,
            written_at=written,
        )
        return False

    def _event(self, kind: str, message: AbstractIncomingMessage) -> bool:
        self.state.records += 1
        try:
            data = json.loads(message.body)
        except ValueError:
            return False  # not ours to understand; a reader never stops on it
        if not isinstance(data, dict):
            return False
        if kind == Event.MARK:
            return data.get("mark") == self.mark
        self._apply(kind, [str(i) for i in data.get("ids") or ()], data.get("at"))
        return False

    def _apply(self, kind: str, ids: list[str], when: object) -> None:
        at = _at(when) or datetime.now(UTC)
        if kind in ENDING_EVENTS:
            for letter_id in ids:
                if self.state.letters.pop(letter_id, None) is not None:
                    self.state.ended += 1
                self.ended_ids.add(letter_id)
                self.archived.pop(letter_id, None)
        elif kind == Event.ARCHIVED:
            for letter_id in ids:
                self.archived[letter_id] = at
        elif kind == Event.UNARCHIVED:
            for letter_id in ids:
                self.archived.pop(letter_id, None)

    def finish(self, archive_retention: timedelta | None, now: datetime) -> LogState:
        for letter_id, at in self.archived.items():
            letter = self.state.letters.get(letter_id)
            if letter is None:
                continue
            if archive_retention is not None and at + archive_retention <= now:
                del self.state.letters[letter_id]
                self.state.ended += 1
            else:
                letter.archived_at = at
        return self.state


def _event_message(kind: Event, data: Mapping[str, Any]) -> aio_pika.Message:
    return aio_pika.Message(
        body=json.dumps(data, separators=(",", ":")).encode(),
        headers={H_DLQ_EVENT: kind.value},
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=uuid.uuid4().hex,
    )


async def _append(channel: AbstractChannel, names: Topology, message: aio_pika.Message) -> None:
    answer = await publish_confirmed(channel.default_exchange, message, names.dead_letter_log)
    if answer is not Published.CONFIRMED:
        raise LogError(f"{names.dead_letter_log}: the broker did not take a record ({answer})")


async def append_event(
    channel: AbstractChannel,
    names: Topology,
    kind: Event,
    ids: Sequence[str],
    *,
    note: str | None = None,
    by: str | None = None,
) -> None:
    """Record ``kind`` for ``ids``, each record confirmed before the next is sent.

    ``channel`` must have publisher confirms. An event is whole or absent: a
    run killed midway has recorded the records before it, for their ids only.
    """
    now = datetime.now(UTC).isoformat()
    for start in range(0, len(ids), IDS_PER_EVENT):
        data = {"ids": list(ids[start : start + IDS_PER_EVENT]), "at": now}
        if note is not None:
            data["note"] = note
        if by is not None:
            data["by"] = by
        await _append(channel, names, _event_message(kind, data))


async def append_letters(
    channel: AbstractChannel, names: Topology, messages: Iterable[aio_pika.Message]
) -> int:
    """Append letters, up to :data:`APPEND_WINDOW` awaiting their confirm; how many.

    Raises :class:`LogError` when one was not confirmed: the ones before it are
    in the stream, and appending them again is harmless (same letter ids).
    """
    done = 0
    window: list[aio_pika.Message] = []

    async def flush() -> None:
        nonlocal done
        await asyncio.gather(*(_append(channel, names, m) for m in window))
        done += len(window)
        window.clear()

    for message in messages:
        window.append(message)
        if len(window) >= APPEND_WINDOW:
            await flush()
    if window:
        await flush()
    return done


async def read_log(
    connection: AbstractConnection,
    names: Topology,
    *,
    archive_retention: timedelta | None = None,
    idle_timeout: float = READ_IDLE_TIMEOUT,
) -> LogState:
    """Every letter still in the stream, and which of them are archived.

    Appends a mark, then reads from the first offset up to it, holding at most
    :data:`READ_PREFETCH` records unacknowledged; a stream's acks only grant
    credit, so a reading removes, reorders and wears out nothing, and killing
    it at any point changes nothing but the one mark it left.
    """
    mark = uuid.uuid4().hex
    writer = await connection.channel(publisher_confirms=True)
    reader = await connection.channel()
    try:
        await _append(writer, names, _event_message(Event.MARK, {"mark": mark}))
        await reader.set_qos(prefetch_count=READ_PREFETCH)
        stream = await reader.declare_queue(names.dead_letter_log, passive=True)
        fold = _Fold(mark)
        end: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        seen = 0
        last_seen = time.monotonic()

        async def on_record(message: AbstractIncomingMessage) -> None:
            nonlocal seen, last_seen
            if end.done():
                return
            seen += 1
            last_seen = time.monotonic()
            reached = fold.add(message)
            if reached or seen % _ACK_EVERY == 0:
                await message.ack(multiple=True)
            if reached:
                end.set_result(None)

        tag = await stream.consume(on_record, arguments={STREAM_OFFSET: "first"})
        while not end.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(end), timeout=1.0)
            if not end.done() and time.monotonic() - last_seen > idle_timeout:
                raise LogError(
                    f"{names.dead_letter_log}: no record for {idle_timeout:g} s after "
                    f"{seen} of them; the reading's mark never came"
                )
        with contextlib.suppress(Exception):
            await asyncio.wait_for(stream.cancel(tag), BROKER_CALL_TIMEOUT)
        return fold.finish(archive_retention, datetime.now(UTC))
    finally:
        for channel in (reader, writer):
            if not channel.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(channel.close(), BROKER_CALL_TIMEOUT)

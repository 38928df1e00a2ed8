"""What a turn of the DLQ does with one letter, and the copy it makes of it.

The actions a command's ``decide`` returns (:class:`Keep`, :class:`Send`,
:class:`Drop`), the letter it is given, the turn's report, and the copy for
the tail built straight from a delivery's properties. The turn itself is
:mod:`semel.consumer.broker.turn`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage
from pamqp.commands import Basic

from semel.consumer import names
from semel.consumer.broker.copies import carried_headers, copy_message

WINDOW = 500  # letters unacknowledged at most, and so copies awaiting their confirm
Properties = Basic.Properties


@dataclass(frozen=True, slots=True)
class Keep:
    """The letter stays: a copy goes to the tail, ``headers`` set or (``None``) removed on it.

    ``expiration`` (milliseconds) makes the broker drop the copy once it has
    waited that long (an archived letter past its retention).
    """

    headers: Mapping[str, Any] = field(default_factory=dict)
    expiration: int | None = None


@dataclass(frozen=True, slots=True)
class Send:
    """The letter leaves once ``message`` is confirmed at ``exchange`` / ``routing_key``.

    An exchange that does not exist, a message the broker returns (no queue
    bound) or refuses: the letter is kept instead, counted ``refused`` (a copy
    refused by the broker goes to the tail when the refusal comes, so a little
    behind its place).
    """

    message: aio_pika.Message
    exchange: str
    routing_key: str


@dataclass(frozen=True, slots=True)
class Drop:
    """The letter leaves, nothing sent."""


Action = Keep | Send | Drop


@dataclass(frozen=True, slots=True)
class Letter:
    """One letter of a turn: its message, its id, its place in the turn (from 0)."""

    message: AbstractIncomingMessage
    letter_id: str
    index: int


Decide = Callable[[Letter], Awaitable[Action]]


@dataclass(slots=True)
class TurnReport:
    depth: int = 0  # letters in the queue when the turn started
    kept: int = 0  # copies to the tail (a refused send's and a delivery beyond's too)
    sent: int = 0
    dropped: int = 0
    doubles: int = 0  # second copies of a letter, dropped
    refused: int = 0  # sends refused (no such exchange, returned, nacked): those letters kept
    short: int = 0  # letters the depth promised that the queue no longer held
    beyond: int = 0  # deliveries past the turn's letters (see short): copied to the tail


def new_letter_id() -> str:
    return uuid.uuid4().hex


class Pace:
    """At most ``rate`` sends a second (``None``: as fast as confirms come)."""

    def __init__(self, rate: float | None) -> None:
        self._gap = None if not rate else 1.0 / rate
        self._next = time.monotonic()

    @property
    def limited(self) -> bool:
        return self._gap is not None

    async def wait(self) -> None:
        if self._gap is None:
            return
        now = time.monotonic()
        if self._next > now:
            await asyncio.sleep(self._next - now)
        self._next = max(self._next, now) + self._gap


def kept_copy(letter: Letter, keep: Keep) -> aio_pika.Message:
    """A letter's copy for the tail: its headers as they are but the broker's, its id
    set, ``keep.headers`` applied (a ``None`` value removes that header)."""
    copy = copy_message(letter.message, kept_headers(letter, keep))
    if keep.expiration is not None:
        copy.expiration = max(1, keep.expiration) / 1000
    return copy


def kept_headers(letter: Letter, keep: Keep) -> dict[str, Any]:
    headers = carried_headers(letter.message.headers or {})
    headers[names.H_LETTER_ID] = letter.letter_id
    for name, value in keep.headers.items():
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = value
    return headers


def tail_properties(
    source: Properties, headers: dict[str, Any], expiration: int | None
) -> Properties:
    """What :func:`kept_copy` publishes, built straight from the delivery's properties: an
    ``aio_pika.Message`` for each of 100,000 letters costs as much as the rest of
    its copy. The properties :func:`~semel.consumer.broker.copies.copy_message`
    keeps, persistent; ``expiration`` in milliseconds."""
    return Properties(
        content_type=source.content_type,
        content_encoding=source.content_encoding,
        headers=headers,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT.value,
        priority=source.priority,
        correlation_id=source.correlation_id,
        reply_to=source.reply_to,
        expiration=None if expiration is None else str(max(1, expiration)),
        message_id=source.message_id,
        timestamp=source.timestamp,
        message_type=source.message_type,
        app_id=source.app_id,
    )

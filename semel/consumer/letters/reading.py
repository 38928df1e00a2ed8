"""What ``semel dlq list``, ``groups`` and ``replay --dry-run`` read: nothing changes.

A reading of the stream (:func:`semel.consumer.letters.log.read_log`) holds
every letter still there, live and archived. A command looks at one of the
two sets (live, unless ``--archived``) and counts what its filters match in
it, and what they would have matched in the other set, so an operator learns
that archived letters were left alone. A dry run also says where a replay
would send each letter (:func:`destination_of`, which the replay itself uses).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aio_pika.abc import AbstractConnection
from aiormq.exceptions import ChannelNotFoundEntity

from semel.consumer.broker.dead_letters import Chooser
from semel.consumer.broker.letter_filters import Group, group_id, groups
from semel.consumer.broker.publishing import BROKER_TROUBLE
from semel.consumer.letters.log import Letter, LogState, read_log
from semel.consumer.names import (
    BROKER_CALL_TIMEOUT,
    DEFAULT_EXCHANGE,
    H_ORIGINAL_EXCHANGE,
    H_ORIGINAL_ROUTING_KEY,
    Topology,
)


@dataclass(slots=True, repr=False)
class Listing:
    """The letters a filter picks out of one set of a reading."""

    def __repr__(self) -> str:  # short: see LogState.__repr__
        return f"Listing({len(self.matched)} matched, {self.live} live, {self.archived} archived)"

    live: int  # live letters in the stream
    archived: int  # archived letters in the stream
    of_archived: bool  # whether the set looked at is the archived letters
    matched: list[Letter] = field(default_factory=list)  # in stream order
    others: int = 0  # letters of the other set the filter matches too

    @property
    def read(self) -> int:
        """How many letters the set looked at holds."""
        return self.archived if self.of_archived else self.live

    def counts(self) -> dict[str, int]:
        """The counts ``--json`` prints first (``depth``: the live letters)."""
        return {"depth": self.live, "archived": self.archived, "matched": len(self.matched)}

    def headline(self, shown: int, *, filtered: bool) -> str:
        """``semel dlq list``'s first line: the counts, before any letter."""
        matched = f"{len(self.matched)} matched, " if filtered else ""
        if self.of_archived:
            first, what = f"{self.archived} archived ({self.live} in the DLQ)", "archived "
        else:
            first, what = f"{self.live} in the DLQ", ""
            first += f" ({self.archived} archived)" if self.archived else ""
        return f"{first}, {matched}{shown} of {len(self.matched)} {what}dead letters shown"


def letter_json(letter: Letter, now: datetime) -> dict[str, Any]:
    """One letter as ``semel dlq list --json`` prints it."""
    archived_at = letter.archived_at and letter.archived_at.isoformat()
    return (
        {"group": group_id(letter.entry)} | letter.entry.as_json(now) | {"archived_at": archived_at}
    )


def listing(state: LogState, chooser: Chooser, *, archived: bool = False) -> Listing:
    """What ``chooser`` picks among the live letters (or the archived ones)."""
    live, stored = state.live(), state.archived()
    looked, other = (stored, live) if archived else (live, stored)
    return Listing(
        live=len(live),
        archived=len(stored),
        of_archived=archived,
        matched=[letter for letter in looked if chooser.matches(letter.entry)],
        others=sum(1 for letter in other if chooser.matches(letter.entry)),
    )


@dataclass(frozen=True, slots=True, order=True)
class Destination:
    """Where a copy is published: an exchange and a routing key."""

    exchange: str  # DEFAULT_EXCHANGE: the routing key names a queue
    routing_key: str

    def __str__(self) -> str:
        if self.exchange == DEFAULT_EXCHANGE:
            return f"queue {self.routing_key!r}"
        return f"exchange {self.exchange!r}, routing key {self.routing_key!r}"


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def destination_of(letter: Letter, work_queue: str, to: str | None = None) -> Destination:
    """The route the letter's producer used; the work queue when it used the default
    exchange or names none; ``to`` (a queue) when given."""
    if to is not None:
        return Destination(DEFAULT_EXCHANGE, to)
    exchange = _text(letter.headers.get(H_ORIGINAL_EXCHANGE))
    routing_key = _text(letter.headers.get(H_ORIGINAL_ROUTING_KEY))
    if not exchange or routing_key is None:
        return Destination(DEFAULT_EXCHANGE, work_queue)
    return Destination(exchange, routing_key)


async def exists(connection: AbstractConnection, destination: Destination) -> bool:
    """Whether the destination's exchange (or, through the default exchange, its queue)
    exists: a passive declare, on a channel of its own (a miss closes it)."""
    channel = await connection.channel()
    try:
        if destination.exchange == DEFAULT_EXCHANGE:
            await channel.declare_queue(destination.routing_key, passive=True)
        else:
            await channel.declare_exchange(destination.exchange, passive=True)
    except ChannelNotFoundEntity:
        return False
    finally:
        if not channel.is_closed:
            with contextlib.suppress(*BROKER_TROUBLE):
                await asyncio.wait_for(channel.close(), BROKER_CALL_TIMEOUT)
    return True


@dataclass(slots=True)
class ReplayPlan:
    """What a replay would send (``--dry-run``): read only, nothing locked or sent."""

    chosen: int
    kept: int  # live letters not chosen
    archived: int  # archived letters the filters match: a replay leaves them alone
    destinations: list[tuple[Destination, int, bool]]  # count, and whether it exists
    groups: list[Group]

    def as_json(self) -> dict[str, Any]:
        return {
            "dry_run": True,
            "replay": self.chosen,
            "kept": self.kept,
            "archived": self.archived,
            "destinations": [
                {"exchange": d.exchange, "routing_key": d.routing_key, "count": n, "exists": ok}
                for d, n, ok in self.destinations
            ],
            "groups": [group.as_json() for group in self.groups],
        }

    def lines(self) -> list[str]:
        """The plan as text: the counts, then the count per destination and per group."""
        text = f"dry run: would replay {self.chosen}, keep {self.kept}"
        lines = [text + (f", {self.archived} archived left alone" if self.archived else "")]
        if self.destinations:
            lines.append("by destination:")
        for destination, count, exists in self.destinations:
            missing = "" if exists else "  (not found: these would fail)"
            lines.append(f"  {count:>6}  {destination}{missing}")
        if self.groups:
            lines.append("by group:")
        for group in self.groups:
            mark = group.fingerprint
            named = " ".join(part for part in (mark.reason, mark.error_type, mark.frame) if part)
            lines.append(f"  {group.count:>6}  {group.group_id}  {named}")
        return lines


async def plan(
    connection: AbstractConnection,
    names: Topology,
    chooser: Chooser,
    *,
    to: str | None = None,
    archive_retention: timedelta | None = None,
) -> ReplayPlan:
    """What :func:`replay` would send where, by destination and by group.

    Writes nothing but the reading's mark, and takes no lock: it may run beside
    any other command.
    """
    state = await read_log(connection, names, archive_retention=archive_retention)
    pick = listing(state, chooser)
    counts = Counter(destination_of(letter, names.queue, to) for letter in pick.matched)
    destinations = [
        (destination, count, await exists(connection, destination))
        for destination, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    ]
    return ReplayPlan(
        chosen=len(pick.matched),
        kept=pick.live - len(pick.matched),
        archived=pick.others,
        destinations=destinations,
        groups=groups(letter.entry for letter in pick.matched),
    )

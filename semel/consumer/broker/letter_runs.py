"""What the DLQ commands do to the letters: each one a turn of ``Q.dlq``.

Reading, grouping and replaying all go through :func:`semel.consumer.broker.turn.turn`,
so each gets its guarantees: a bounded number of letters unacknowledged,
nothing lost if the command is killed, no delivery-limit count spent, the
order kept. Each ``decide`` below says what happens to one letter; every
letter it does not take is kept (:func:`keep`).

An archived letter (``semel dlq archive``) is kept with its archiving time and
leaves once ``retention`` has passed since: every turn drops it then, and each
copy carries the time it has left as its expiration, so the broker drops it
at the head of the queue even if no command runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection

from semel.consumer import names
from semel.consumer.broker.dead_letters import (
    RESET_REASONS,
    Chooser,
    DlqEntry,
    read_entry,
    replay_copy,
)
from semel.consumer.broker.turn import Action, Drop, Keep, Letter, Send, turn
from semel.consumer.delivery.message import fingerprint, parse_body
from semel.consumer.errors import BadMessage
from semel.consumer.names import Topology

DEFAULT_RETENTION = timedelta(days=14)


def keep(entry: DlqEntry, now: datetime, retention: timedelta) -> Keep | Drop:
    """The letter stays as it is; an archived one only until its retention ends."""
    if entry.archived_at is None:
        return Keep()
    left = entry.archived_at + retention - now
    if left <= timedelta(0):
        return Drop()
    return Keep(expiration=max(1, int(left.total_seconds() * 1000)))


def shown(entry: DlqEntry, archived: bool) -> bool:
    """Whether a command sees this letter: archived ones only with ``--archived``."""
    return archived or entry.archived_at is None


def chosen(entry: DlqEntry, chooser: Chooser, archived: bool) -> bool:
    """Whether a command takes this letter: seen by it (:func:`shown`) and matched."""
    return shown(entry, archived) and chooser.matches(entry)


@dataclass(slots=True)
class Reading:
    """What a reading turn found."""

    depth: int = 0  # letters in the DLQ when it started
    read: int = 0  # letters read (second copies of a letter not counted)
    matched: int = 0
    hidden: int = 0  # archived, left out
    expired: int = 0  # archived past their retention: dropped
    shown: list[DlqEntry] = field(default_factory=list)  # the first ``limit`` matched
    gathered: list[DlqEntry] = field(default_factory=list)  # every match, when asked


async def read_letters(
    connection: AbstractConnection,
    channel: AbstractChannel,
    topology: Topology,
    chooser: Chooser,
    *,
    limit: int | None = None,
    gather: bool = False,
    archived: bool = False,
    retention: timedelta = DEFAULT_RETENTION,
) -> Reading:
    """Read every letter, leaving each where it is; count, show and gather the matches."""
    reading = Reading()
    now = datetime.now(UTC)

    async def decide(letter: Letter) -> Action:
        entry = read_entry(letter.message)
        reading.read += 1
        action = keep(entry, now, retention)
        if isinstance(action, Drop):
            reading.expired += 1
        elif not shown(entry, archived):
            reading.hidden += 1
        elif chooser.matches(entry):
            reading.matched += 1
            if limit is None or len(reading.shown) < limit:
                reading.shown.append(entry)
            if gather:
                reading.gathered.append(entry)
        return action

    report = await turn(connection, channel, topology.dead_letter_queue, decide)
    reading.depth = report.depth
    return reading


Reset = Callable[[str, str | None], Awaitable[bool]]


@dataclass(slots=True)
class ReplayReport:
    replayed: int = 0
    kept: int = 0  # not selected, left in the DLQ
    failed: int = 0  # selected, but the copy was returned or refused; left in the DLQ
    reset: int = 0  # keys reset in the store
    dry_run: bool = False
    # Where the copies went (or, in a dry run, would go): "exchange / routing key".
    destinations: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        if self.dry_run:
            where = ", ".join(f"{n} to {d}" for d, n in self.destinations.most_common())
            return f"would replay {sum(self.destinations.values())}" + (
                f": {where}" if where else ""
            )
        text = f"replayed {self.replayed}, kept {self.kept}"
        return text + (f", failed {self.failed}" if self.failed else "")


@dataclass(frozen=True, slots=True)
class Route:
    exchange: str
    routing_key: str

    def __str__(self) -> str:
        return f"{self.exchange or '(default exchange)'} / {self.routing_key}"


def destination(entry: DlqEntry, work_queue: str, to: str | None) -> Route:
    """Where a replayed copy goes: ``to`` (a queue), else the producer's own route,
    else (the default exchange, or no route recorded) the work queue."""
    if to is not None:
        return Route("", to)
    if entry.exchange and entry.routing_key is not None:
        return Route(entry.exchange, entry.routing_key)
    return Route("", work_queue)


async def replay(
    connection: AbstractConnection,
    channel: AbstractChannel,
    topology: Topology,
    chooser: Chooser,
    reset: Reset,
    *,
    to: str | None = None,
    rate: float | None = None,
    dry_run: bool = False,
    archived: bool = False,
    retention: timedelta = DEFAULT_RETENTION,
) -> ReplayReport:
    """Send a copy of each chosen letter where it belongs, and remove the letter once
    the copy is confirmed.

    For each one: reset its key (when its reason left state in the store),
    then publish a copy, mandatory, carrying one more ``x-semel-replays``. A
    copy the broker returns or refuses leaves its letter in the DLQ. A reset
    takes only a failed key (:meth:`semel.stores.base.Store.reset`): the second
    letter of a key whose first copy already completed, or a replay run again
    after its copy completed, replays a duplicate. ``dry_run`` changes nothing
    and counts where the copies would go.
    """
    report = ReplayReport(dry_run=dry_run)
    now = datetime.now(UTC)

    async def decide(letter: Letter) -> Action:
        entry = read_entry(letter.message)
        action = keep(entry, now, retention)
        if isinstance(action, Drop) or not chosen(entry, chooser, archived):
            report.kept += isinstance(action, Keep)
            return action
        route = destination(entry, topology.queue, to)
        report.destinations[str(route)] += 1
        if dry_run:
            report.kept += 1
            return action
        if entry.key is not None and entry.reason in RESET_REASONS:
            report.reset += int(await reset(entry.key, edited_fingerprint(letter)))
        return Send(replayed_copy(letter, entry), route.exchange, route.routing_key)

    turned = await turn(connection, channel, topology.dead_letter_queue, decide, rate=rate)
    report.replayed = turned.sent
    report.failed = turned.refused
    return report


def edited_fingerprint(letter: Letter) -> str | None:
    """The body's fingerprint for a letter imported after an edit, else ``None``.

    Its key's record holds the fingerprint of the body that failed: reset
    without this, the edited copy would be a payload mismatch.
    """
    message = letter.message
    if not (message.headers or {}).get(names.H_EDITED_FROM):
        return None
    try:
        return fingerprint(parse_body(message.body, message.content_type, len(message.body)))
    except BadMessage:
        return None  # not JSON: its copy is dead-lettered as malformed, whatever the record


def replayed_copy(letter: Letter, entry: DlqEntry) -> aio_pika.Message:
    copy = replay_copy(letter.message)
    assert copy.headers is not None  # replay_copy always sets them
    copy.headers[names.H_REPLAYS] = entry.replays + 1
    return copy

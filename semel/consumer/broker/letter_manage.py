"""Discard, archive, unarchive, export and import: each a turn of ``Q.dlq``; and the audit.

Every change goes through :func:`semel.consumer.broker.turn.turn`, so it has a
turn's guarantees (bounded, nothing lost when killed, order kept, one command
at a time). Each ``choose`` below says what happens to a letter a command
takes; every other letter is kept as :func:`letter_runs.keep` says (an
archived one past its retention leaves).

What an operator changed is recorded in ``Q.dlq.audit`` (:func:`record`), a
quorum queue the broker keeps at its newest :data:`AUDIT_LIMIT` records, read
by a turn of its own (:func:`read_audit`). Nothing here prints or prompts:
:mod:`semel.consumer.commands.dlq_manage` does.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import orjson
from aio_pika.abc import AbstractChannel, AbstractConnection

from semel.consumer import names
from semel.consumer.broker.dead_letters import Chooser, DlqEntry, read_entry
from semel.consumer.broker.header_codec import Edited, export_record
from semel.consumer.broker.letter_runs import DEFAULT_RETENTION, chosen, keep
from semel.consumer.broker.publishing import Published, publish_confirmed
from semel.consumer.broker.turn import Action, Drop, Keep, Letter, turn
from semel.consumer.errors import EXIT_USAGE, SemelError
from semel.consumer.names import JSON_CONTENT_TYPE, Topology

AUDIT_SUFFIX = ".audit"
AUDIT_LIMIT = 10_000  # records the broker keeps (x-max-length, the oldest dropped)
IDS_PER_RECORD = 10_000  # letter ids in one record; more make several
# While a turn of the audit queue runs, up to its window of copies wait there
# beside the records not yet acked; in a full queue each copy would make the
# broker drop the record at the head, one the turn has not read yet (newer than
# the copies it keeps). So a turn first drops the oldest records past
# AUDIT_KEPT, which the broker would drop at the next records anyway.
AUDIT_WINDOW = 100
AUDIT_KEPT = AUDIT_LIMIT - 2 * AUDIT_WINDOW
PUBLISH_WINDOW = 200  # imported letters awaiting their confirm at once


class NotConfirmed(SemelError):
    """The broker did not take a record or an imported letter (exit 1, one line)."""


class ImportRefused(SemelError):
    """A line of an import names a letter that is gone; nothing was imported (exit 2)."""

    exit_code = EXIT_USAGE


def audit_queue(topology: Topology) -> str:
    return topology.dead_letter_queue + AUDIT_SUFFIX


@dataclass(frozen=True, slots=True)
class Dlq:
    """Where a command works: its connection (which holds the DLQ's lock once a turn
    took it), a channel with publisher confirms on it, the names, the archive retention."""

    connection: AbstractConnection
    channel: AbstractChannel
    topology: Topology
    retention: timedelta = DEFAULT_RETENTION


async def declare_audit(dlq: Dlq) -> str:
    """Declare ``Q.dlq.audit`` (idempotent); on a channel of its own, since a queue
    declared with other arguments closes the channel it is asked on."""
    name = audit_queue(dlq.topology)
    arguments: dict[str, Any] = {
        "x-queue-type": "quorum",
        "x-max-length": AUDIT_LIMIT,
        "x-overflow": "drop-head",
    }
    channel = await dlq.connection.channel()
    try:
        await channel.declare_queue(name, durable=True, arguments=arguments)
    finally:
        await channel.close()
    return name


async def record(dlq: Dlq, what: Mapping[str, Any], ids: Mapping[str, Sequence[str]]) -> int:
    """Publish, confirmed, what an operator did (``what``: op, by, note, filters ...)
    and the letter ids, one record per :data:`IDS_PER_RECORD` ids; how many records.

    ``ids`` maps names to lists of one length (``ids``, and an import's
    ``new_ids``): each record holds the same slice of each. The queue must be
    declared (:func:`declare_audit`).
    """
    total = len(ids["ids"])
    parts = max(1, -(-total // IDS_PER_RECORD))
    run = uuid.uuid4().hex
    base = {"at": datetime.now(UTC).isoformat(), **what, "count": total, "run": run}
    for part in range(parts):
        chunk = slice(part * IDS_PER_RECORD, (part + 1) * IDS_PER_RECORD)
        body = base | {name: list(values[chunk]) for name, values in ids.items()}
        body |= {"part": part + 1, "parts": parts}
        message = aio_pika.Message(
            orjson.dumps(body),
            content_type=JSON_CONTENT_TYPE,
            message_id=f"{run}-{part + 1}",
            headers={names.H_LETTER_ID: f"{run}-{part + 1}"},
        )
        queue = audit_queue(dlq.topology)
        answer = await publish_confirmed(dlq.channel.default_exchange, message, queue)
        if answer is not Published.CONFIRMED:
            raise NotConfirmed(f"the broker answered {answer} to an audit record")
    return parts


async def read_audit(dlq: Dlq, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` records, newest first, read by a turn of the audit queue."""
    newest: deque[bytes] = deque(maxlen=limit)
    name = await declare_audit(dlq)
    queue = await dlq.channel.declare_queue(name, passive=True)
    excess = (queue.declaration_result.message_count or 0) - AUDIT_KEPT

    async def decide(letter: Letter) -> Action:
        if letter.index < excess:
            return Drop()
        newest.append(letter.message.body)
        return Keep()

    await turn(dlq.connection, dlq.channel, name, decide, window=AUDIT_WINDOW)
    return [_record_of(body) for body in reversed(newest)]


def _record_of(body: bytes) -> dict[str, Any]:
    try:
        found = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {"op": None, "unreadable": body[:200].decode("utf-8", "replace")}
    return found if isinstance(found, dict) else {"op": None, "unreadable": str(found)[:200]}


@dataclass(slots=True)
class Changed:
    """What a command's turn did."""

    depth: int = 0  # letters in the DLQ when it started
    changed: int = 0  # letters discarded, archived, unarchived or replaced
    expired: int = 0  # archived past their retention: dropped on the way
    ids: list[str] = field(default_factory=list)  # of the letters changed


# What a command does with a letter: ``None`` leaves it as it is, an action takes
# it (counted as changed). ``kept`` is what leaving it would do.
Choose = Callable[[Letter, DlqEntry, Keep], Action | None]


async def _change(dlq: Dlq, choose: Choose) -> Changed:
    """Turn the DLQ once, doing with each letter what ``choose`` says."""
    changed = Changed()
    now = datetime.now(UTC)

    async def decide(letter: Letter) -> Action:
        entry = read_entry(letter.message)
        kept = keep(entry, now, dlq.retention)
        if isinstance(kept, Drop):
            changed.expired += 1
            return kept
        action = choose(letter, entry, kept)
        if action is None:
            return kept
        changed.changed += 1
        changed.ids.append(letter.letter_id)
        return action

    report = await turn(dlq.connection, dlq.channel, dlq.topology.dead_letter_queue, decide)
    changed.depth = report.depth
    return changed


async def matching(dlq: Dlq, chooser: Chooser, *, archived: bool) -> Changed:
    """The ids of the letters ``chooser`` matches, each left where it is (what a
    question counts before a discard)."""

    def choose(letter: Letter, entry: DlqEntry, kept: Keep) -> Action | None:
        return kept if chosen(entry, chooser, archived) else None

    return await _change(dlq, choose)


async def discard(
    dlq: Dlq, chooser: Chooser, *, archived: bool, only: frozenset[str] | None = None
) -> Changed:
    """Remove the letters ``chooser`` matches; only those in ``only`` when given (the
    ones an operator agreed to: a letter that arrived since the question stays)."""

    def choose(letter: Letter, entry: DlqEntry, kept: Keep) -> Action | None:
        if only is not None and letter.letter_id not in only:
            return None
        return Drop() if chosen(entry, chooser, archived) else None

    return await _change(dlq, choose)


async def archive(dlq: Dlq, chooser: Chooser, *, note: str | None) -> Changed:
    """Mark the live letters ``chooser`` matches archived; each leaves ``retention`` later."""
    headers = {names.H_ARCHIVED_AT: datetime.now(UTC).isoformat(), names.H_ARCHIVE_NOTE: note}
    lasting = Keep(headers=headers, expiration=int(dlq.retention.total_seconds() * 1000))

    def choose(letter: Letter, entry: DlqEntry, kept: Keep) -> Action | None:
        live = entry.archived_at is None
        return lasting if live and chooser.matches(entry) else None

    return await _change(dlq, choose)


async def unarchive(dlq: Dlq, chooser: Chooser) -> Changed:
    """Make the archived letters ``chooser`` matches live again, with no expiration."""
    live = Keep(headers={names.H_ARCHIVED_AT: None, names.H_ARCHIVE_NOTE: None})

    def choose(letter: Letter, entry: DlqEntry, kept: Keep) -> Action | None:
        archived = entry.archived_at is not None
        return live if archived and chooser.matches(entry) else None

    return await _change(dlq, choose)


async def export(
    dlq: Dlq, chooser: Chooser, write: Callable[[bytes], object], *, archived: bool
) -> Changed:
    """Hand ``write`` one JSON line per letter ``chooser`` matches, each left where it is."""

    def choose(letter: Letter, entry: DlqEntry, kept: Keep) -> Action | None:
        if not chosen(entry, chooser, archived):
            return None
        write(orjson.dumps(export_record(letter.message, letter.letter_id, entry)) + b"\n")
        return kept

    return await _change(dlq, choose)


@dataclass(frozen=True, slots=True)
class Imported:
    published: int  # new letters published by this run
    resumed: int  # new letters an earlier, killed run had published
    replaced: int  # letters removed by this run (an earlier run may have removed others)


async def import_letters(dlq: Dlq, edits: Sequence[Edited], *, keep_message_id: bool) -> Imported:
    """Publish each edited letter, confirmed, to the DLQ; then one turn removes the
    letters they replace.

    A reading turn first finds which are there: a line whose new letter is
    there already (an import killed and run again) is not published twice; a
    line whose letter and new letter are both gone refuses the import before
    anything is written. The lock is held from the first turn to the last.
    """
    replaced = {edit.replaces for edit in edits}
    fresh = {edit.letter_id for edit in edits}
    present: set[str] = set()

    def look(letter: Letter, entry: DlqEntry, kept: Keep) -> Action | None:
        if letter.letter_id in replaced or letter.letter_id in fresh:
            present.add(letter.letter_id)
        return None

    await _change(dlq, look)
    for edit in edits:
        if edit.replaces not in present and edit.letter_id not in present:
            raise ImportRefused(
                f"line {edit.line}: letter {edit.replaces} is no longer in the DLQ (replayed, "
                "discarded or expired since it was exported); nothing was imported"
            )
    due = [edit for edit in edits if edit.letter_id not in present]
    messages = [edit.message(keep_message_id=keep_message_id) for edit in due]
    await _publish_all(dlq.channel, dlq.topology.dead_letter_queue, messages)

    def drop(letter: Letter, entry: DlqEntry, kept: Keep) -> Action | None:
        return Drop() if letter.letter_id in replaced else None

    done = await _change(dlq, drop)
    return Imported(len(due), len(edits) - len(due), done.changed)


async def _publish_all(
    channel: AbstractChannel, queue: str, messages: list[aio_pika.Message]
) -> None:
    """Publish each to ``queue``, at most :data:`PUBLISH_WINDOW` awaiting a confirm."""
    for start in range(0, len(messages), PUBLISH_WINDOW):
        batch = messages[start : start + PUBLISH_WINDOW]
        answers = await asyncio.gather(
            *(publish_confirmed(channel.default_exchange, message, queue) for message in batch)
        )
        refused = [answer for answer in answers if answer is not Published.CONFIRMED]
        if refused:
            raise NotConfirmed(
                f"the broker answered {refused[0]} to an imported letter; "
                f"{start + len(batch) - len(refused)} published: run the import again to finish"
            )

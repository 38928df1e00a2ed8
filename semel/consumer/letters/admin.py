"""What an operator does to dead letters where they are: discard, archive, unarchive, keep.

Each takes the writers' lock, reads the stream under it (so it acts on what is
there now, not on what an earlier reading saw), appends one event for the
letters it chose, and at its end carries forward every letter still there,
as every writer does (:func:`semel.consumer.letters.writing.carry_forward`).
Nothing here prints or prompts: :mod:`semel.consumer.commands.dlq_manage` does.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from aio_pika.abc import AbstractChannel, AbstractConnection

from semel.consumer.broker.dead_letters import Chooser
from semel.consumer.letters.log import (
    ENDING_EVENTS,
    Event,
    Letter,
    LogState,
    append_event,
    read_log,
)
from semel.consumer.letters.writing import carry_forward, writer_lock
from semel.consumer.names import Topology


@dataclass(frozen=True, slots=True)
class Done:
    """What one command did, and the stream as it left it."""

    matched: int  # letters the choice matched
    changed: int  # letters the event was recorded for
    carried: int  # letters copied forward at the end
    live: int  # after the command
    archived: int  # after the command
    ended: int  # letters the reading found ended before the command

    def as_json(self) -> dict[str, int]:
        return {
            "matched": self.matched,
            "changed": self.changed,
            "carried": self.carried,
            "live": self.live,
            "archived": self.archived,
            "ended": self.ended,
        }


def operator() -> str:
    """``user@host``: who an event says did it (best effort; never fails a command)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (a bare container)
        user = "unknown"
    return f"{user}@{socket.gethostname() or 'unknown'}"


def pool(state: LogState, *, archived: bool) -> list[Letter]:
    """The letters a command looks at: the live ones, or the archived ones."""
    return state.archived() if archived else state.live()


async def select(
    connection: AbstractConnection,
    names: Topology,
    chooser: Chooser,
    *,
    archived: bool,
    retention: timedelta,
) -> tuple[list[Letter], LogState]:
    """The letters ``chooser`` matches, read without the lock (what a question counts),
    and the reading."""
    state = await read_log(connection, names, archive_retention=retention)
    chosen = [letter for letter in pool(state, archived=archived) if chooser.matches(letter.entry)]
    return chosen, state


def nothing(state: LogState) -> Done:
    """What a command that matched nothing did."""
    return _done(state, 0, 0, 0, state.ended)


def _done(state: LogState, matched: int, changed: int, carried: int, ended: int) -> Done:
    return Done(
        matched=matched,
        changed=changed,
        carried=carried,
        live=len(state.live()),
        archived=len(state.archived()),
        ended=ended,
    )


async def act(
    connection: AbstractConnection,
    channel: AbstractChannel,
    names: Topology,
    kind: Event,
    chooser: Chooser,
    *,
    archived: bool,
    retention: timedelta,
    note: str | None = None,
    only: Collection[str] | None = None,
) -> Done:
    """Record ``kind`` for the letters ``chooser`` matches among the live ones (the
    archived ones with ``archived``), and only those in ``only`` when given (the
    letters an operator agreed to at a prompt: one that arrived since is spared).

    ``channel`` must have publisher confirms.
    """
    async with writer_lock(connection, names):
        state = await read_log(connection, names, archive_retention=retention)
        ended = state.ended
        matched = [x for x in pool(state, archived=archived) if chooser.matches(x.entry)]
        chosen = [x.letter_id for x in matched if only is None or x.letter_id in only]
        if chosen:
            await append_event(channel, names, kind, chosen, note=note, by=operator())
        # The state carried forward must be the one after the event: an ended
        # letter's copy must never follow the event that ended it.
        if kind in ENDING_EVENTS:
            for letter_id in chosen:
                del state.letters[letter_id]
        elif kind is Event.ARCHIVED:
            now = datetime.now(UTC)
            for letter_id in chosen:
                state.letters[letter_id].archived_at = now
        elif kind is Event.UNARCHIVED:
            for letter_id in chosen:
                state.letters[letter_id].archived_at = None
        carried = await carry_forward(channel, names, state)
        return _done(state, len(matched), len(chosen), carried, ended)


async def keep(
    connection: AbstractConnection, channel: AbstractChannel, names: Topology, retention: timedelta
) -> Done:
    """Read the stream under the lock and carry forward what is due; nothing else."""
    async with writer_lock(connection, names):
        state = await read_log(connection, names, archive_retention=retention)
        carried = await carry_forward(channel, names, state)
        return _done(state, 0, 0, carried, state.ended)

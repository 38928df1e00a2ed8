"""``semel dlq discard``, ``archive``, ``unarchive`` and ``keep``: dead letters changed in place.

The work is :mod:`semel.consumer.letters.admin`; this module turns the options
into its calls and its answers into a line or JSON. :func:`register_manage`
adds these commands, and :mod:`~semel.consumer.commands.dlq_transfer`'s
(``export``, ``import``, ``migrate``), to the ``dlq`` group that
:mod:`semel.consumer.commands.dlq` makes.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated

import typer
from typer import Option

from semel.consumer.broker.letter_filters import LetterFilter
from semel.consumer.commands.common import echo_json, fail
from semel.consumer.commands.dlq_filters import with_filters
from semel.consumer.commands.dlq_transfer import (
    Archived,
    AsJson,
    Stream,
    plural,
    register_transfer,
    with_stream,
)
from semel.consumer.errors import EXIT_FAILURE, EXIT_USAGE
from semel.consumer.letters import admin
from semel.consumer.letters.admin import Done
from semel.consumer.letters.log import Event

Everything = Annotated[bool, Option("--all", help="Every dead letter (without a filter).")]
_CHOOSE = (
    "give a filter or --all: --group, --key-prefix, --routing-key, --error, --since, "
    "--until, --min-attempts, --key, --reason or --all"
)


def _chosen(filters: LetterFilter, everything: bool) -> LetterFilter:
    if filters.empty == (not everything):
        fail(_CHOOSE, EXIT_USAGE)
    return filters


def _report(done: Done, verb: str, as_json: bool) -> None:
    if as_json:
        echo_json(done.as_json())
        return
    if not done.matched:
        typer.echo(f"No dead letter matched; nothing {verb}.")
        return
    spared = done.matched - done.changed
    since = f" ({spared} arrived after the question and were left)" if spared else ""
    typer.echo(
        f"{plural(done.changed).capitalize()} {verb}{since}; "
        f"{done.live} live and {done.archived} archived left."
    )


def _act(
    filters: LetterFilter, kind: Event, *, archived: bool, note: str | None, ask: str | None
) -> Done | None:
    """Record ``kind`` for the letters matched; ``None`` when the operator said no.

    With ``ask``, the letters are counted first (without the lock: a question
    may wait for minutes) and the operator asked; then only the letters
    counted are acted on, so one that arrived meanwhile is never included.
    """

    async def action(stream: Stream) -> Done | None:
        retention = stream.settings.dlq_archive_retention
        only: set[str] | None = None
        if ask is not None:
            chosen, state = await admin.select(
                stream.connection, stream.names, filters, archived=archived, retention=retention
            )
            if not chosen:
                return admin.nothing(state)
            # In a thread: the loop keeps the connection's heartbeats going meanwhile.
            if not await asyncio.to_thread(typer.confirm, ask.format(plural(len(chosen)))):
                return None
            only = {letter.letter_id for letter in chosen}
        return await admin.act(
            stream.connection,
            stream.channel,
            stream.names,
            kind,
            filters,
            archived=archived,
            retention=retention,
            note=note,
            only=only,
        )

    return with_stream(action)


def _given(done: Done | None) -> Done:
    assert done is not None, "only a question answered no gives None"
    return done


@with_filters
def discard_command(
    filters: LetterFilter,
    note: Annotated[
        str,
        Option(help="Why they are discarded: recorded with your user@host.", show_default=False),
    ],
    everything: Everything = False,
    yes: Annotated[bool, Option("--yes", "-y", help="Do not ask first.")] = False,
    archived: Archived = False,
    as_json: AsJson = False,
) -> None:
    """End dead letters for good without replaying them.

    Takes the live dead letters the filters match (all of them must), or
    --all (the archived ones with --archived); asks first unless --yes. They
    stay in the stream, ended by a `discarded` event with the note, until its
    retention drops them.
    """
    chooser = _chosen(filters, everything)
    if not note.strip():
        fail("--note must say why the dead letters are discarded", EXIT_USAGE)
    if not yes and not sys.stdin.isatty():
        fail("discard asks before it discards, and there is no terminal: give --yes", EXIT_USAGE)
    ask = None if yes else "Discard {}?"
    done = _act(chooser, Event.DISCARDED, archived=archived, note=note, ask=ask)
    if done is None:
        typer.echo("Nothing discarded.", err=True)
        raise typer.Exit(EXIT_FAILURE)
    _report(done, "discarded", as_json)


@with_filters
def archive_command(
    filters: LetterFilter,
    note: Annotated[str | None, Option(help="Why: recorded with your user@host.")] = None,
    everything: Everything = False,
    as_json: AsJson = False,
) -> None:
    """Hide live dead letters from list, groups, replay, discard and export.

    They end SEMEL_DLQ_ARCHIVE_RETENTION (14 days by default) after they were
    archived, unless unarchived first; the commands show them with --archived.
    """
    done = _act(_chosen(filters, everything), Event.ARCHIVED, archived=False, note=note, ask=None)
    _report(_given(done), "archived", as_json)


@with_filters
def unarchive_command(
    filters: LetterFilter, everything: Everything = False, as_json: AsJson = False
) -> None:
    """Make archived dead letters live again."""
    done = _act(_chosen(filters, everything), Event.UNARCHIVED, archived=True, note=None, ask=None)
    _report(_given(done), "unarchived", as_json)


def keep_command(as_json: AsJson = False) -> None:
    """Copy forward every dead letter whose newest copy is a week old.

    What every command that changes the dead letters does at its end, and a
    running worker every few hours: the stream drops records after 28 days.
    """

    async def action(stream: Stream) -> Done:
        retention = stream.settings.dlq_archive_retention
        return await admin.keep(stream.connection, stream.channel, stream.names, retention)

    done = with_stream(action)
    if as_json:
        echo_json(done.as_json())
        return
    typer.echo(
        f"{done.live} live and {done.archived} archived dead letters; "
        f"{done.carried} copied forward."
    )


def register_manage(group: typer.Typer) -> None:
    """Add ``discard``, ``archive``, ``unarchive``, ``keep``, ``export``, ``import`` and
    ``migrate`` to the ``dlq`` group."""
    group.command("discard")(discard_command)
    group.command("archive")(archive_command)
    group.command("unarchive")(unarchive_command)
    group.command("keep")(keep_command)
    register_transfer(group)

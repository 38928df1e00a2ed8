"""``semel dlq export``, ``import`` and ``migrate``: dead letters out of the stream and in.

The work is :mod:`semel.consumer.letters.transfer` and
:mod:`semel.consumer.letters.migration`. What every dead-letter command of
:mod:`semel.consumer.commands.dlq_manage` and this module shares is here too:
:func:`with_stream`, the ``--archived`` and ``--json`` options.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, TypeVar

import orjson
import typer
from aio_pika.abc import AbstractChannel, AbstractConnection
from typer import Argument, Option

from semel.consumer.broker.letter_filters import LetterFilter
from semel.consumer.commands.common import confirm_channel, echo_json, fail, run_with_container
from semel.consumer.commands.dlq_filters import with_filters
from semel.consumer.container import Container
from semel.consumer.errors import EXIT_FAILURE, EXIT_USAGE
from semel.consumer.letters import migration, transfer
from semel.consumer.letters.log import read_log
from semel.consumer.names import Topology
from semel.settings import Settings

T = TypeVar("T")

Archived = Annotated[
    bool, Option("--archived", help="The archived dead letters instead of the live ones.")
]
AsJson = Annotated[bool, Option("--json", help="Print the counts as JSON.")]


@dataclass(frozen=True, slots=True)
class Stream:
    """What a command on the dead letters works with."""

    connection: AbstractConnection
    channel: AbstractChannel  # publisher confirms
    names: Topology
    settings: Settings


def with_stream(action: Callable[[Stream], Awaitable[T]]) -> T:
    """Run ``action`` on the dead letters' stream; one error line and its exit code
    if it fails."""

    async def run(container: Container) -> T:
        async with confirm_channel(container, dead_letters_only=True) as channel:
            connection: AbstractConnection = await container.tool_connection.async_()
            names = container.topology().names
            return await action(Stream(connection, channel, names, container.settings()))

    return run_with_container(run)


def plural(count: int) -> str:
    return f"{count} dead letter{'' if count == 1 else 's'}"


@with_filters
def export_command(
    filters: LetterFilter,
    archived: Archived = False,
    output: Annotated[
        str, Option("--output", "-o", help="The file to write; `-` for standard output.")
    ] = "-",
) -> None:
    """Write the dead letters the filters match as JSON Lines, one letter a line.

    Each line holds the letter whole: body (`body`, or `body_base64` when not
    UTF-8), the producer's headers in tagged JSON, semel's headers and the
    properties. Edit a body and give the file to `semel dlq import`.
    """

    async def action(stream: Stream) -> list[bytes]:
        retention = stream.settings.dlq_archive_retention
        state = await read_log(stream.connection, stream.names, archive_retention=retention)
        letters = state.archived() if archived else state.live()
        return [
            orjson.dumps(transfer.export_record(letter))
            for letter in letters
            if filters.matches(letter.entry)
        ]

    lines = with_stream(action)
    if output == "-":
        for line in lines:
            typer.echo(line.decode())
        return
    try:  # written once the reading is done: a failed one leaves no half file
        Path(output).write_bytes(b"".join(line + b"\n" for line in lines))
    except OSError as exc:
        fail(f"--output {output}: {exc.strerror or exc}")
    typer.echo(f"Exported {plural(len(lines))} to {output}.", err=True)


def import_command(
    file: Annotated[str, Argument(help="An edited export; `-` for standard input.")],
    note: Annotated[str | None, Option(help="Why: recorded with your user@host.")] = None,
    as_json: AsJson = False,
) -> None:
    """Put edited dead letters back: each line a new letter replacing the one it names.

    The new letter gets a new id and a new message id (unless SEMEL_KEY_SOURCE
    is message_id), and keeps its key; once all are written, the letters they
    replace end. A line that is not a letter stops the import before anything
    is written.
    """
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"{file}: {getattr(exc, 'strerror', None) or exc}", EXIT_USAGE)
    try:
        edits = transfer.parse_import(text.splitlines())
    except transfer.ImportRefused as exc:
        fail(f"{file}: {exc}", EXIT_USAGE)

    async def action(stream: Stream) -> transfer.Imported:
        return await transfer.import_letters(
            stream.connection,
            stream.channel,
            stream.names,
            edits,
            keep_message_id=stream.settings.key_source == "message_id",
            retention=stream.settings.dlq_archive_retention,
            note=note,
        )

    done = with_stream(action)
    if as_json:
        echo_json({"imported": done.imported + done.resumed, "carried": done.carried})
        return
    typer.echo(f"Imported {plural(done.imported + done.resumed)}; the ones they replace are ended.")


def migrate_command(
    keep_queue: Annotated[
        bool, Option("--keep-queue", help="Leave the emptied old queue in place.")
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Move an earlier version's dead-letter queue (SEMEL_QUEUE.dlq) into the stream.

    Each dead letter is acknowledged only after its copy was confirmed, so a
    migration stopped at any point can be run again; each letter is kept once.
    The emptied queue is deleted unless --keep-queue.
    """

    async def action(stream: Stream) -> tuple[migration.Migrated, Topology]:
        done = await migration.migrate(
            stream.connection,
            stream.channel,
            stream.names,
            keep_queue=keep_queue,
            retention=stream.settings.dlq_archive_retention,
        )
        return done, stream.names

    done, names = with_stream(action)
    if as_json:
        echo_json(asdict(done))
    elif not done.found:
        typer.echo(f"No {names.dead_letter_queue}: nothing to move.")
    else:
        left = "deleted" if done.deleted else "kept" if keep_queue else "not deleted: still in use"
        typer.echo(
            f"Moved {plural(done.moved)} from {names.dead_letter_queue} into "
            f"{names.dead_letter_log}; {names.dead_letter_queue} {left}."
        )
    if done.found and not done.deleted and not keep_queue:
        raise typer.Exit(EXIT_FAILURE)


def register_transfer(group: typer.Typer) -> None:
    """Add ``export``, ``import`` and ``migrate`` to the ``dlq`` group."""
    group.command("export")(export_command)
    group.command("import")(import_command)
    group.command("migrate")(migrate_command)

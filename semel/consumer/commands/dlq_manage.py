"""``semel dlq discard``, ``archive``, ``unarchive``, ``export``, ``import`` and ``audit``.

The broker work is :mod:`semel.consumer.broker.letter_manage` (each command one
or more turns of the DLQ), the line format :mod:`semel.consumer.broker.header_codec`;
this module turns the options into their calls, asks before a discard, and
records what each change did in ``Q.dlq.audit`` before it reports success.
"""

from __future__ import annotations

import functools
import getpass
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer import Argument, Option

from semel.consumer.broker import letter_manage
from semel.consumer.broker.header_codec import Edited, LineRefused, parse_import
from semel.consumer.broker.letter_filters import LetterFilter
from semel.consumer.broker.letter_manage import Changed, Dlq
from semel.consumer.commands.common import echo_json, fail, letters_channel, run_with_container
from semel.consumer.commands.dlq_filters import with_filters
from semel.consumer.container import Container
from semel.consumer.errors import EXIT_FAILURE, EXIT_USAGE

T = TypeVar("T")

Everything = Annotated[bool, Option("--all", help="Every dead letter (without a filter).")]
Archived = Annotated[bool, Option("--archived", help="Include archived dead letters.")]
AsJson = Annotated[bool, Option("--json", help="Print the counts as JSON.")]
Note = Annotated[str | None, Option(help="Why: recorded in the audit with your user@host.")]
_CHOOSE = (
    "give a filter or --all: --group, --key-prefix, --routing-key, --error, --since, "
    "--until, --min-attempts, --key, --reason or --all"
)


def operator() -> str:
    """``user@host``: who a record says did it (best effort; never fails a command)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (a bare container)
        user = "unknown"
    return f"{user}@{socket.gethostname() or 'unknown'}"


def filters_json(filters: LetterFilter, **options: bool) -> dict[str, Any]:
    """The filters an operator gave, as a record shows them, and the options set."""
    given = {f.name: getattr(filters, f.name) for f in fields(filters) if f.init} | options
    plain = {k: sorted(v) if isinstance(v, frozenset) else v for k, v in given.items()}
    plain = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in plain.items()}
    return {k: v for k, v in plain.items() if v is not None and v is not False and v != []}


def plural(count: int) -> str:
    return f"{count} dead letter{'' if count == 1 else 's'}"


def _on_dlq(work: Callable[[Dlq, Container], Awaitable[T]]) -> T:
    """Run ``work`` on the command's connection and a confirm channel; what goes wrong
    (another command's lock, a refused import, the broker) is one line and its exit code."""

    async def run(container: Container) -> T:
        async with letters_channel(container) as (connection, channel):
            names = container.topology().names
            retention = container.settings().dlq_archive_retention
            return await work(Dlq(connection, channel, names, retention), container)

    return run_with_container(run)


def _change(
    op: str, change: Callable[[Dlq], Awaitable[Changed]], note: str | None, given: dict[str, Any]
) -> Changed:
    """Run ``change``, then record it (the audit queue declared before anything changes)."""

    async def work(dlq: Dlq, _: Container) -> Changed:
        await letter_manage.declare_audit(dlq)
        done = await change(dlq)
        what = {"op": op, "by": operator(), "note": note, "filters": given}
        await letter_manage.record(dlq, what | {"expired": done.expired}, {"ids": done.ids})
        return done

    return _on_dlq(work)


def _chosen(filters: LetterFilter, everything: bool) -> LetterFilter:
    if filters.empty == (not everything):
        fail(_CHOOSE, EXIT_USAGE)
    return filters


def _report(done: Changed, verb: str, as_json: bool) -> None:
    if as_json:
        echo_json({verb: done.changed, "depth": done.depth, "expired": done.expired})
    elif not done.changed:
        typer.echo(f"No dead letter matched; nothing {verb}.")
    else:
        typer.echo(f"{plural(done.changed).capitalize()} {verb}.")


@with_filters
def discard_command(
    filters: LetterFilter,
    everything: Everything = False,
    note: Note = None,
    yes: Annotated[bool, Option("--yes", "-y", help="Do not ask first.")] = False,
    archived: Archived = False,
    as_json: AsJson = False,
) -> None:
    """Remove dead letters for good, without replaying them.

    Takes the dead letters the filters match (all of them must), or --all.
    Asks first, showing how many, unless --yes: a first turn of the DLQ counts
    them, and only the letters counted are removed (one dead-lettered since
    stays). Recorded in the audit (`semel dlq audit`).
    """
    chooser = _chosen(filters, everything)
    if not yes and not sys.stdin.isatty():
        fail(
            "discard asks before it removes anything, and there is no terminal: give --yes",
            EXIT_USAGE,
        )
    only: frozenset[str] | None = None
    if not yes:

        async def count(dlq: Dlq, _: Container) -> Changed:
            return await letter_manage.matching(dlq, chooser, archived=archived)

        counted = _on_dlq(count)
        if counted.changed and not typer.confirm(f"Discard {plural(counted.changed)}?"):
            typer.echo("Nothing discarded.", err=True)
            raise typer.Exit(EXIT_FAILURE)
        only = frozenset(counted.ids)
    given = filters_json(filters, all=everything, archived=archived, yes=yes)
    discard = functools.partial(
        letter_manage.discard, chooser=chooser, archived=archived, only=only
    )
    _report(_change("discard", discard, note, given), "discarded", as_json)


@with_filters
def archive_command(
    filters: LetterFilter,
    everything: Everything = False,
    note: Note = None,
    as_json: AsJson = False,
) -> None:
    """Hide dead letters from list, groups, replay, discard and export until they expire.

    Each leaves the DLQ SEMEL_DLQ_ARCHIVE_RETENTION (14 days by default) after
    it was archived, unless unarchived first; the commands show archived
    letters with --archived. Recorded in the audit.
    """
    archive = functools.partial(
        letter_manage.archive, chooser=_chosen(filters, everything), note=note
    )
    done = _change("archive", archive, note, filters_json(filters, all=everything))
    _report(done, "archived", as_json)


@with_filters
def unarchive_command(
    filters: LetterFilter, everything: Everything = False, as_json: AsJson = False
) -> None:
    """Make archived dead letters live again (they no longer expire). Recorded in the audit."""
    unarchive = functools.partial(letter_manage.unarchive, chooser=_chosen(filters, everything))
    done = _change("unarchive", unarchive, None, filters_json(filters, all=everything))
    _report(done, "unarchived", as_json)


@with_filters
def export_command(
    filters: LetterFilter,
    output: Annotated[
        str, Option("--output", "-o", help="The file to write; `-` for standard output.")
    ] = "-",
    archived: Archived = False,
) -> None:
    """Write the dead letters the filters match as JSON Lines, one letter a line; each
    stays in the DLQ.

    A line holds the letter whole: its id, what `list` shows, the producer's
    headers and semel's in tagged JSON ({"$table"}, {"$bytes"}, {"$decimal"},
    {"$time"}), its properties, and the body as `body` (UTF-8) or
    `body_base64`. Edit a body and give the file to `semel dlq import`.
    """

    def run(write: Callable[[bytes], object]) -> Changed:
        async def work(dlq: Dlq, _: Container) -> Changed:
            return await letter_manage.export(dlq, filters, write, archived=archived)

        return _on_dlq(work)

    if output == "-":
        with tempfile.TemporaryFile() as spool:  # a failed export prints no half
            done = run(spool.write)
            spool.seek(0)
            sys.stdout.flush()
            shutil.copyfileobj(spool, sys.stdout.buffer)
            sys.stdout.buffer.flush()
        return
    part = Path(output + ".part")
    try:
        sink = part.open("wb")
    except OSError as exc:
        fail(f"--output {output}: {exc.strerror or exc}", EXIT_USAGE)
    try:
        with sink:
            done = run(sink.write)
        os.replace(part, output)  # a failed export leaves no half file
    finally:
        part.unlink(missing_ok=True)
    typer.echo(f"Exported {plural(done.changed)} to {output}.", err=True)


def import_command(
    file: Annotated[str, Argument(help="An edited export; `-` for standard input.")],
    note: Note = None,
    as_json: AsJson = False,
) -> None:
    """Put edited dead letters back: each line a new letter replacing the one it names.

    Every line is checked first: one that is not a letter stops the import
    before anything is written. Each new letter gets an id of its own (the
    same for the same line and body, so an import killed and run again adds
    none twice), x-semel-edited-from naming the letter it replaces, a new
    message id unless SEMEL_KEY_SOURCE is message_id, and the same key. Once
    all are confirmed, one turn of the DLQ removes the letters they replace.
    Recorded in the audit.
    """
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
        edits = parse_import(text.splitlines())
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"{file}: {getattr(exc, 'strerror', None) or exc}", EXIT_USAGE)
    except LineRefused as exc:
        fail(f"{file}: {exc}", EXIT_USAGE)
    if not edits:
        typer.echo(f"No dead letters in {file}; nothing imported.")
        return
    done = _on_dlq(lambda dlq, container: _import(dlq, container, edits, note, file))
    if as_json:
        echo_json(done)
        return
    resumed = f" ({done['resumed']} published by an earlier run)" if done["resumed"] else ""
    typer.echo(
        f"Imported {plural(len(edits))}{resumed}; {done['replaced']} replaced letters removed."
    )


async def _import(
    dlq: Dlq, container: Container, edits: list[Edited], note: str | None, file: str
) -> dict[str, int]:
    await letter_manage.declare_audit(dlq)
    keep_message_id = container.settings().key_source == "message_id"
    done = await letter_manage.import_letters(dlq, edits, keep_message_id=keep_message_id)
    counts = {"published": done.published, "resumed": done.resumed, "replaced": done.replaced}
    what = {"op": "import", "by": operator(), "note": note, "filters": {"file": file}} | counts
    ids = {"ids": [e.replaces for e in edits], "new_ids": [e.letter_id for e in edits]}
    await letter_manage.record(dlq, what, ids)
    return {"imported": len(edits)} | counts


def audit_command(
    limit: Annotated[int, Option(min=1, help="Show at most this many records.")] = 20,
    as_json: Annotated[bool, Option("--json", help="Print the records as JSON.")] = False,
) -> None:
    """Show the newest records of what operators did (discard, archive, unarchive,
    import), newest first.

    Read by a turn of Q.dlq.audit, which keeps each record; the broker keeps
    the newest 10,000. A change of more than 10,000 letters is recorded in
    several records (part, parts).
    """

    async def work(dlq: Dlq, _: Container) -> list[dict[str, Any]]:
        return await letter_manage.read_audit(dlq, limit)

    records = _on_dlq(work)
    if as_json:
        echo_json({"records": records})
        return
    typer.echo(f"{len(records)} audit records shown")
    if records:
        Console().print(_audit_table(records))


def _audit_table(records: list[dict[str, Any]]) -> Table:
    table = Table("at", "op", "by", "count", "note", "filters")
    for found in records:
        count = str(found.get("count", "-"))
        if found.get("parts", 1) != 1:
            count += f" (part {found.get('part')} of {found.get('parts')})"
        filters = found.get("filters") or {}
        shown = (
            " ".join(f"{k}={v}" for k, v in filters.items()) if isinstance(filters, dict) else ""
        )
        cells = (found.get("at"), found.get("op"), found.get("by"), count, found.get("note"), shown)
        # Text, not str: a note or a filter must never be read as rich markup.
        table.add_row(*(Text("-" if cell in (None, "") else str(cell)) for cell in cells))
    return table


def register_manage(group: typer.Typer) -> None:
    """Add ``discard``, ``archive``, ``unarchive``, ``export``, ``import`` and ``audit``
    to the ``dlq`` group."""
    group.command("discard")(discard_command)
    group.command("archive")(archive_command)
    group.command("unarchive")(unarchive_command)
    group.command("export")(export_command)
    group.command("import")(import_command)
    group.command("audit")(audit_command)

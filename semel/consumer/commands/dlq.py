"""``semel dlq list``, ``groups`` and ``replay``: look at the dead letters, and send them back.

The broker work is :mod:`semel.consumer.broker.letter_runs` (each command one
turn of the DLQ, :mod:`semel.consumer.broker.turn`), the filters and
groups :mod:`semel.consumer.broker.letter_filters`; this module turns the
options into their calls and their answers into a table, a summary or JSON.
The filter options are declared once, in :mod:`semel.consumer.commands.dlq_filters`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer import Option

from semel.consumer.broker import letter_runs
from semel.consumer.broker.dead_letters import DlqEntry
from semel.consumer.broker.letter_filters import (
    GROUP_ID_LENGTH,
    Group,
    LetterFilter,
    group_id,
    groups,
)
from semel.consumer.broker.letter_runs import Reading, ReplayReport
from semel.consumer.commands.common import (
    echo_json,
    fail,
    letters_channel,
    open_store,
    run_with_container,
)
from semel.consumer.commands.dlq_filters import with_filters
from semel.consumer.commands.dlq_manage import register_manage
from semel.consumer.container import Container
from semel.consumer.errors import EXIT_FAILURE, EXIT_USAGE
from semel.consumer.names import ERROR_FRAME_LIMIT

TABLE_KEY_WIDTH = 40
TABLE_ERROR_WIDTH = 60
TABLE_MIN_ERROR_WIDTH = 12
_COLUMNS = ("reason", "key", "attempts", "replays", "error", "age", "routing key")
_ERROR_COLUMN = _COLUMNS.index("error")


def _shown(value: str | None, width: int) -> str:
    if not value:
        return "-"
    if not value.isprintable():
        value = value.encode("unicode_escape").decode("ascii")
    return value if len(value) <= width else value[: width - 1] + "…"


def _age(age: timedelta | None) -> str:
    if age is None:
        return "-"
    seconds = max(0, int(age.total_seconds()))
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def _table(entries: list[DlqEntry], now: datetime, width: int) -> Table:
    """One line per dead letter; the error column gives way on a narrow terminal."""
    rows = [
        [
            _shown(entry.reason, TABLE_KEY_WIDTH),
            _shown(entry.key, TABLE_KEY_WIDTH),
            "-" if entry.attempts is None else str(entry.attempts),
            str(entry.replays),
            entry.error or "",
            _age(entry.age(now)),
            _shown(entry.routing_key, TABLE_KEY_WIDTH),
        ]
        for entry in entries
    ]
    others = sum(
        max(len(title), *(len(row[i]) for row in rows))
        for i, title in enumerate(_COLUMNS)
        if i != _ERROR_COLUMN
    )
    room = width - others - 3 * len(_COLUMNS) - 1  # borders and padding
    error_width = max(TABLE_MIN_ERROR_WIDTH, min(TABLE_ERROR_WIDTH, room))
    table = Table(*_COLUMNS)
    for row in rows:
        row[_ERROR_COLUMN] = _shown(row[_ERROR_COLUMN], error_width)
        # Text, not str: a key or error must never be read as rich markup.
        table.add_row(*(Text(cell) for cell in row))
    return table


def _groups_table(found: list[Group], now: datetime, width: int) -> Table:
    """One row of two lines per group. The id and count are never cut; the sample
    gives way first on a narrow terminal (and goes on a very narrow one), then a
    type or frame folds onto more lines."""
    marks = [(g.fingerprint.error_type or "-", g.fingerprint.frame or "-") for g in found]
    reasons = [_shown(g.fingerprint.reason, TABLE_KEY_WIDTH) for g in found]
    fixed = GROUP_ID_LENGTH + max(5, *(len(str(g.count)) for g in found))
    fixed += max(6, *(len(r) for r in reasons)) + len("first seen") + 3 * 6 + 1
    mark_width = max(len("error type"), *(len(line) for mark in marks for line in mark))
    sample_width = min(TABLE_ERROR_WIDTH, width - fixed - mark_width)
    sample_width = max(sample_width, min(TABLE_MIN_ERROR_WIDTH, width - fixed - len("error type")))
    table = Table()
    table.add_column("group", no_wrap=True, min_width=GROUP_ID_LENGTH)
    table.add_column("count", no_wrap=True, justify="right")
    table.add_column("reason", no_wrap=True)
    table.add_column("error type\nframe", overflow="fold", min_width=len("error type"))
    table.add_column("first seen\nlast seen", no_wrap=True)
    sampled = sample_width >= TABLE_MIN_ERROR_WIDTH
    if sampled:
        table.add_column("sample key\nsample error", no_wrap=True, max_width=sample_width)
    for group, (error_type, frame), reason in zip(found, marks, reasons, strict=True):
        cells = [
            Text(group.group_id),
            Text(str(group.count)),
            Text(reason),
            _two_lines(error_type, frame, ERROR_FRAME_LIMIT),
            Text(f"{_ago(group.first_seen, now)}\n{_ago(group.last_seen, now)}"),
        ]
        if sampled:
            cells.append(_two_lines(group.sample_key, group.sample_error, sample_width))
        table.add_row(*cells)
    return table


def _two_lines(first: str | None, second: str | None, width: int) -> Text:
    # Text, not str: a key or error must never be read as rich markup.
    return Text(f"{_shown(first, width)}\n{_shown(second, width)}")


def _ago(instant: datetime | None, now: datetime) -> str:
    return "-" if instant is None else f"{_age(now - instant)} ago"


def _read(filters: LetterFilter, *, limit: int | None, gather: bool, archived: bool) -> Reading:
    """One turn of the DLQ: every dead letter read, each left there."""

    async def run(container: Container) -> Reading:
        async with letters_channel(container) as (connection, channel):
            return await letter_runs.read_letters(
                connection,
                channel,
                container.topology().names,
                filters,
                limit=limit,
                gather=gather,
                archived=archived,
                retention=container.settings().dlq_archive_retention,
            )

    return run_with_container(run)


_ARCHIVED_HELP = "Include archived dead letters."


@with_filters
def list_command(
    filters: LetterFilter,
    limit: Annotated[int, Option(min=1, help="Show at most this many dead letters.")] = 50,
    archived: Annotated[bool, Option("--archived", help=_ARCHIVED_HELP)] = False,
    as_json: Annotated[bool, Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show the dead letters without removing any from the DLQ.

    The whole DLQ is read once, in order (a turn: each letter copied to the
    tail, confirmed, before it is acked), to count what the filters match;
    the first --limit matches are shown.
    """
    reading = _read(filters, limit=limit, gather=False, archived=archived)
    shown = reading.shown
    now = datetime.now(UTC)
    if as_json:
        entries = [{"group": group_id(entry)} | entry.as_json(now) for entry in shown]
        echo_json(_counts(reading) | {"shown": len(shown), "dead_letters": entries})
        return
    matched = "" if filters.empty else f"{reading.matched} matched, "
    typer.echo(
        f"{reading.depth} in the DLQ, {_hidden(reading)}{matched}"
        f"{len(shown)} of {reading.matched} dead letters shown"
    )
    if shown:
        console = Console()
        console.print(_table(shown, now, console.width))


@with_filters
def groups_command(
    filters: LetterFilter,
    archived: Annotated[bool, Option("--archived", help=_ARCHIVED_HELP)] = False,
    as_json: Annotated[bool, Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Group the dead letters by reason and error fingerprint, the largest group first.

    A handler's failure (max-attempts, permanent-error) is grouped by its
    exception's type and the handler's own frame; bad input by its reason
    alone. The whole DLQ is read, and every dead letter left in it.
    """
    reading = _read(filters, limit=0, gather=True, archived=archived)
    found = groups(reading.gathered)
    if as_json:
        echo_json(_counts(reading) | {"groups": [group.as_json() for group in found]})
        return
    matched = "" if filters.empty else f"{reading.matched} matched, "
    typer.echo(f"{reading.read} dead letters read, {_hidden(reading)}{matched}{len(found)} groups")
    if found:
        console = Console()
        console.print(_groups_table(found, datetime.now(UTC), console.width))


# Listed so that the old form's usage stays in the one error line.
_CHOOSE = (
    "give a filter or --all: --group, --key-prefix, --routing-key, --error, --since, "
    "--until, --min-attempts, --key, --reason or --all"
)


@with_filters
def replay_command(
    filters: LetterFilter,
    replay_all: Annotated[bool, Option("--all", help="Replay every dead letter.")] = False,
    to: Annotated[
        str | None,
        Option(
            "--to",
            metavar="QUEUE",
            help="Send every copy to this queue (through the default exchange) instead of "
            "its original exchange and routing key.",
        ),
    ] = None,
    rate: Annotated[
        float | None,
        Option(min=0.001, help="Send at most this many copies a second (default: no limit)."),
    ] = None,
    dry_run: Annotated[
        bool, Option("--dry-run", help="Change nothing: say how many would go, and where.")
    ] = False,
    archived: Annotated[bool, Option("--archived", help=_ARCHIVED_HELP)] = False,
    as_json: Annotated[bool, Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Send dead letters back to their original route and reset their keys to run again.

    A copy goes to its letter's original exchange and routing key (every queue
    bound there gets one), or to the work queue when that was the default
    exchange, or with --to to one queue.

    Takes the dead letters the filters match (all of them must), or --all.
    A dead letter leaves the DLQ only after its copy was confirmed; each copy
    carries x-semel-replays, one more than its letter's. Keys are reset for
    max-attempts, permanent-error and poison; the other reasons never wrote
    the key's state.
    """
    if filters.empty == (not replay_all):
        fail(_CHOOSE, EXIT_USAGE)

    async def run(container: Container) -> ReplayReport:
        # The store first: one that cannot be reached stops the run before any
        # dead letter is taken from the DLQ.
        store = await open_store(container)
        async with letters_channel(container) as (connection, channel):
            return await letter_runs.replay(
                connection,
                channel,
                container.topology().names,
                filters,
                store.reset,
                to=to,
                rate=rate,
                dry_run=dry_run,
                archived=archived,
                retention=container.settings().dlq_archive_retention,
            )

    report = run_with_container(run)
    if as_json:
        echo_json(_replay_json(report))
    else:
        typer.echo(report.summary())
    if report.failed:
        raise typer.Exit(EXIT_FAILURE)


def _counts(reading: Reading) -> dict[str, Any]:
    return {
        "depth": reading.depth,
        "read": reading.read,
        "matched": reading.matched,
        "archived_hidden": reading.hidden,
        "expired": reading.expired,
    }


def _hidden(reading: Reading) -> str:
    return f"{reading.hidden} archived hidden, " if reading.hidden else ""


def _replay_json(report: ReplayReport) -> dict[str, Any]:
    return {
        "replayed": report.replayed,
        "kept": report.kept,
        "failed": report.failed,
        "reset": report.reset,
        "dry_run": report.dry_run,
        "destinations": dict(report.destinations),
    }


def register(app: typer.Typer) -> None:
    """Add the ``dlq`` group (``list``, ``groups``, ``replay``, and the commands of
    :mod:`semel.consumer.commands.dlq_manage`) to the ``semel`` application."""
    group = typer.Typer(
        help="Look at, group, replay, discard, archive, export and import dead letters.",
        no_args_is_help=True,
    )
    group.command("list")(list_command)
    group.command("groups")(groups_command)
    group.command("replay")(replay_command)
    register_manage(group)
    app.add_typer(group, name="dlq")

"""``semel dlq list``, ``groups`` and ``replay``: look at the dead letters, and send them back.

The broker work is :mod:`semel.consumer.broker.dead_letters`, the filters and
groups :mod:`semel.consumer.broker.letter_filters`; this module turns the
options into their calls and their answers into a table, a summary or JSON.
The filter options are declared once, in :mod:`semel.consumer.commands.dlq_filters`.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer import Option

from semel.consumer.broker import dead_letters
from semel.consumer.broker.dead_letters import DlqEntry, Listing, ReplayReport
from semel.consumer.broker.letter_filters import (
    GROUP_ID_LENGTH,
    Group,
    LetterFilter,
    group_id,
    groups,
)
from semel.consumer.commands.common import (
    confirm_channel,
    echo_json,
    fail,
    open_store,
    run_with_container,
)
from semel.consumer.commands.dlq_filters import with_filters
from semel.consumer.container import Container
from semel.consumer.errors import EXIT_FAILURE, EXIT_USAGE
from semel.consumer.names import ERROR_FRAME_LIMIT

TABLE_KEY_WIDTH = 40
TABLE_ERROR_WIDTH = 60
TABLE_MIN_ERROR_WIDTH = 12
_COLUMNS = ("reason", "key", "attempts", "error", "age", "routing key")
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


def _read(limit: int | None) -> Listing:
    """The DLQ's first ``limit`` dead letters (all of them: ``None``), each left there."""

    async def run(container: Container) -> Listing:
        async with confirm_channel(container, dead_letters_only=True) as channel:
            return await dead_letters.list_dead_letters(channel, container.topology().names, limit)

    return run_with_container(run)


@with_filters
def list_command(
    filters: LetterFilter,
    limit: Annotated[int, Option(min=1, help="Show at most this many dead letters.")] = 50,
    as_json: Annotated[bool, Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show the dead letters without removing any from the DLQ.

    With a filter, the whole DLQ is read to count what it matches; without
    one, only the first --limit dead letters.
    """
    listing = _read(None if not filters.empty else limit)
    matching = [entry for entry in listing.letters if filters.matches(entry)]
    matched = len(matching) if not filters.empty else listing.depth
    shown = matching[:limit]
    now = datetime.now(UTC)
    if as_json:
        entries = [{"group": group_id(entry)} | entry.as_json(now) for entry in shown]
        counts = {"depth": listing.depth, "matched": matched, "shown": len(shown)}
        echo_json(counts | {"dead_letters": entries})
        return
    found = "" if filters.empty else f"{matched} matched, "
    typer.echo(f"{listing.depth} in the DLQ, {found}{len(shown)} of {matched} dead letters shown")
    if shown:
        console = Console()
        console.print(_table(shown, now, console.width))


@with_filters
def groups_command(
    filters: LetterFilter,
    as_json: Annotated[bool, Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Group the dead letters by reason and error fingerprint, the largest group first.

    A handler's failure (max-attempts, permanent-error) is grouped by its
    exception's type and the handler's own frame; bad input by its reason
    alone. The whole DLQ is read, and every dead letter left in it.
    """
    listing = _read(None)
    matching = [entry for entry in listing.letters if filters.matches(entry)]
    found = groups(matching)
    if as_json:
        counts = {"depth": listing.depth, "read": len(listing.letters), "matched": len(matching)}
        echo_json(counts | {"groups": [group.as_json() for group in found]})
        return
    matched = "" if filters.empty else f", {len(matching)} matched"
    typer.echo(f"{len(listing.letters)} dead letters read{matched}, {len(found)} groups")
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
    as_json: Annotated[bool, Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Re-publish dead letters to the work queue and reset their keys so they run again.

    Takes the dead letters the filters match (all of them must), or --all.
    A dead letter leaves the DLQ only after its copy was confirmed. Keys are
    reset for max-attempts, permanent-error and poison; the other reasons
    never wrote the key's state.
    """
    if filters.empty == (not replay_all):
        fail(_CHOOSE, EXIT_USAGE)

    async def run(container: Container) -> ReplayReport:
        # The store first: one that cannot be reached stops the run before any
        # dead letter is taken from the DLQ.
        store = await open_store(container)
        async with confirm_channel(container, dead_letters_only=True) as channel:
            return await dead_letters.replay(
                channel, container.topology().names, filters, store.reset
            )

    report = run_with_container(run)
    if as_json:
        echo_json(asdict(report))
    else:
        typer.echo(report.summary())
    if report.failed:
        raise typer.Exit(EXIT_FAILURE)


def register(app: typer.Typer) -> None:
    """Add the ``dlq`` group (``list``, ``groups``, ``replay``) to the ``semel`` application."""
    group = typer.Typer(help="Look at, group and replay dead letters.", no_args_is_help=True)
    group.command("list")(list_command)
    group.command("groups")(groups_command)
    group.command("replay")(replay_command)
    app.add_typer(group, name="dlq")

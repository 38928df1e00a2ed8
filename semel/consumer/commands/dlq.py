"""``semel dlq list`` and ``semel dlq replay``: look at the dead letters, and send them back.

The broker work is :mod:`semel.consumer.broker.dead_letters`; this module turns the
options into its calls and its answers into a table, a summary or JSON.
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
from semel.consumer.broker.dead_letters import DlqEntry, Listing, ReplayReport, Selection
from semel.consumer.commands.common import (
    confirm_channel,
    echo_json,
    fail,
    open_store,
    run_with_container,
)
from semel.consumer.container import Container
from semel.consumer.errors import EXIT_FAILURE, EXIT_USAGE
from semel.consumer.names import Reason

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


def list_command(
    limit: Annotated[int, Option(min=1, help="Show at most this many dead letters.")] = 50,
    as_json: Annotated[bool, Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show the dead letters without removing any from the DLQ."""

    async def run(container: Container) -> Listing:
        async with confirm_channel(container, dead_letters_only=True) as channel:
            return await dead_letters.list_dead_letters(channel, container.topology().names, limit)

    listing = run_with_container(run)
    now = datetime.now(UTC)
    if as_json:
        entries = [entry.as_json(now) for entry in listing.letters]
        echo_json({"depth": listing.depth, "dead_letters": entries})
        return
    console = Console()
    if listing.letters:
        console.print(_table(listing.letters, now, console.width))
    typer.echo(f"{len(listing.letters)} of {listing.depth} dead letters shown")


def replay_command(
    key: Annotated[str | None, Option(help="Replay the dead letters of this key.")] = None,
    reason: Annotated[
        Reason | None, Option(help="Replay the dead letters with this reason.")
    ] = None,
    replay_all: Annotated[bool, Option("--all", help="Replay every dead letter.")] = False,
    as_json: Annotated[bool, Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Re-publish dead letters to the work queue and reset their keys so they run again.

    A dead letter leaves the DLQ only after its copy was confirmed. Keys are
    reset for max-attempts, permanent-error and poison; the other reasons
    never wrote the key's state.
    """
    if sum((key is not None, reason is not None, replay_all)) != 1:
        fail("give exactly one of --key, --reason or --all", EXIT_USAGE)
    selection = Selection(key=key, reason=reason, everything=replay_all)

    async def run(container: Container) -> ReplayReport:
        # The store first: one that cannot be reached stops the run before any
        # dead letter is taken from the DLQ.
        store = await open_store(container)
        async with confirm_channel(container, dead_letters_only=True) as channel:
            return await dead_letters.replay(
                channel, container.topology().names, selection, store.reset
            )

    report = run_with_container(run)
    if as_json:
        echo_json(asdict(report))
    else:
        typer.echo(report.summary())
    if report.failed:
        raise typer.Exit(EXIT_FAILURE)


def register(app: typer.Typer) -> None:
    """Add the ``dlq`` group (``list``, ``replay``) to the ``semel`` application."""
    group = typer.Typer(help="Look at and replay dead letters.", no_args_is_help=True)
    group.command("list")(list_command)
    group.command("replay")(replay_command)
    app.add_typer(group, name="dlq")

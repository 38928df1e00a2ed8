"""``semel dlq list``, ``groups`` and ``replay``: look at the dead letters, and send them back.

The dead letters live in the stream ``Q.dead-letters``
(:mod:`semel.consumer.letters.log`); a replay is :mod:`semel.consumer.letters.replay`,
the filters and groups :mod:`semel.consumer.broker.letter_filters`. This module
turns the options into their calls and their answers into a table, a summary
or JSON. The filter options are declared once, in
:mod:`semel.consumer.commands.dlq_filters`; discard, archive, export, import,
migrate and keep are :mod:`semel.consumer.commands.dlq_manage`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Annotated, TypeVar

import typer
from aio_pika.abc import AbstractConnection
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer import Option

from semel.consumer.broker.letter_filters import (
    GROUP_ID_LENGTH,
    Group,
    LetterFilter,
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
from semel.consumer.commands.dlq_manage import register_manage
from semel.consumer.container import Container
from semel.consumer.errors import EXIT_FAILURE, EXIT_USAGE
from semel.consumer.letters import replay as replays
from semel.consumer.letters.log import Letter, LogState, read_log
from semel.consumer.letters.reading import Listing, ReplayPlan, letter_json, listing, plan
from semel.consumer.names import ERROR_FRAME_LIMIT, Topology

T = TypeVar("T")

TABLE_KEY_WIDTH = 40
TABLE_ERROR_WIDTH = 60
TABLE_MIN_ERROR_WIDTH = 12
LETTER_ID_SHOWN = 12  # hex characters of a letter id in the table
_COLUMNS = ("id", "reason", "key", "attempts", "replays", "error", "age", "routing key")
_ERROR_COLUMN = _COLUMNS.index("error")
# Left out, in this order, while the table is wider than the terminal with the
# error at its narrowest: the id and key (what an operator copies into a
# filter) and the counts stay. --json has every field.
_GIVE_WAY = ("routing key", "age")


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


def _row(letter: Letter, now: datetime) -> list[str]:
    entry = letter.entry
    return [
        letter.letter_id[:LETTER_ID_SHOWN],
        _shown(entry.reason, TABLE_KEY_WIDTH),
        _shown(entry.key, TABLE_KEY_WIDTH),
        "-" if entry.attempts is None else str(entry.attempts),
        str(entry.replays),
        entry.error or "",
        _age(entry.age(now)),
        _shown(entry.routing_key, TABLE_KEY_WIDTH),
    ]


def _table(letters: list[Letter], now: datetime, width: int) -> tuple[Table, list[str]]:
    """One line per dead letter, and the columns left out: the error column gives
    way first on a narrow terminal, then the columns of ``_GIVE_WAY``."""
    rows = [_row(letter, now) for letter in letters]
    widths = [max(len(title), *(len(row[i]) for row in rows)) for i, title in enumerate(_COLUMNS)]
    shown = list(range(len(_COLUMNS)))

    def others() -> int:  # the shown columns but the error, with borders and padding
        return sum(widths[i] for i in shown if i != _ERROR_COLUMN) + 3 * len(shown) + 1

    left_out = []
    for title in _GIVE_WAY:
        if others() + TABLE_MIN_ERROR_WIDTH <= width:
            break
        shown.remove(_COLUMNS.index(title))
        left_out.append(title)
    error_width = max(TABLE_MIN_ERROR_WIDTH, min(TABLE_ERROR_WIDTH, width - others()))
    table = Table(*(_COLUMNS[i] for i in shown))
    for column in table.columns:
        # What an operator copies into --key or a discard: never cut, never folded.
        column.no_wrap = column.header in ("id", "key")
    for row in rows:
        row[_ERROR_COLUMN] = _shown(row[_ERROR_COLUMN], error_width)
        # Text, not str: a key or error must never be read as rich markup.
        table.add_row(*(Text(row[i]) for i in shown))
    return table, left_out


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


async def _with_log(
    container: Container, action: Callable[[AbstractConnection, Topology], Awaitable[T]]
) -> T:
    """``action`` on the command's connection, once the dead letters' stream exists
    (declared on a broker that never had it; nothing else is touched)."""
    async with confirm_channel(container, dead_letters_only=True):
        connection: AbstractConnection = await container.tool_connection.async_()
        return await action(connection, container.topology().names)


def _retention(container: Container) -> timedelta:
    retention: timedelta = container.settings().dlq_archive_retention
    return retention


def _listing(filters: LetterFilter, archived: bool) -> Listing:
    async def run(container: Container) -> Listing:
        async def read(connection: AbstractConnection, names: Topology) -> LogState:
            return await read_log(connection, names, archive_retention=_retention(container))

        return listing(await _with_log(container, read), filters, archived=archived)

    return run_with_container(run)


ARCHIVED_HELP = "Look at the archived dead letters instead of the live ones."


@with_filters
def list_command(
    filters: LetterFilter,
    archived: Annotated[bool, Option("--archived", help=ARCHIVED_HELP)] = False,
    limit: Annotated[int, Option(min=1, help="Show at most this many dead letters.")] = 50,
    as_json: Annotated[bool, Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show the dead letters, oldest first, and how many the filters match.

    Reading takes nothing away and changes no letter: the stream is read from
    its start, every time, by any number of readers at once.
    """
    found = _listing(filters, archived)
    shown = found.matched[:limit]
    now = datetime.now(UTC)
    if as_json:
        entries = [letter_json(letter, now) for letter in shown]
        echo_json(found.counts() | {"shown": len(shown), "dead_letters": entries})
        return
    typer.echo(found.headline(len(shown), filtered=not filters.empty))
    if shown:
        console = Console()
        table, left_out = _table(shown, now, console.width)
        console.print(table)
        if left_out:
            typer.echo(f"left out at this width: {', '.join(left_out)} (--json has them)")


@with_filters
def groups_command(
    filters: LetterFilter,
    archived: Annotated[bool, Option("--archived", help=ARCHIVED_HELP)] = False,
    as_json: Annotated[bool, Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Group the dead letters by reason and error fingerprint, the largest group first.

    A handler's failure (max-attempts, permanent-error) is grouped by its
    exception's type and the handler's own frame; bad input by its reason
    alone. Reading takes nothing away.
    """
    found = _listing(filters, archived)
    gathered = groups(letter.entry for letter in found.matched)
    if as_json:
        counts = found.counts() | {"read": found.read}
        echo_json(counts | {"groups": [group.as_json() for group in gathered]})
        return
    matched = "" if filters.empty else f", {len(found.matched)} matched"
    what = "archived dead letters" if archived else "dead letters"
    typer.echo(f"{found.read} {what} read{matched}, {len(gathered)} groups")
    if gathered:
        console = Console()
        console.print(_groups_table(gathered, datetime.now(UTC), console.width))


# Listed so that the old form's usage stays in the one error line.
_CHOOSE = (
    "give a filter or --all: --group, --key-prefix, --routing-key, --error, --since, "
    "--until, --min-attempts, --key, --reason or --all"
)
_RATE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(?:/s)?")


def _rate(text: str | None) -> float | None:
    if text is None:
        return None
    given = _RATE.fullmatch(text.strip())
    rate = float(given.group(1)) if given else 0.0
    if rate <= 0:
        fail(f"--rate {text!r}: give dead letters a second, more than 0: 50 or 50/s", EXIT_USAGE)
    return rate


def _dry_run(filters: LetterFilter, to: str | None, as_json: bool) -> None:
    async def run(container: Container) -> ReplayPlan:
        async def read(connection: AbstractConnection, names: Topology) -> ReplayPlan:
            return await plan(
                connection, names, filters, to=to, archive_retention=_retention(container)
            )

        return await _with_log(container, read)

    found = run_with_container(run)
    if as_json:
        echo_json(found.as_json())
    else:
        typer.echo("\n".join(found.lines()))


_DRY_RUN_HELP = "Print what would go where, by destination and group; send nothing."
_RATE_HELP = "Send at most N copies a second (50 or 50/s). Default: as fast as confirmed."
_TO_HELP = (
    "Send the copies to this queue, through the default exchange, instead of each "
    "letter's original exchange and routing key."
)


@with_filters
def replay_command(
    filters: LetterFilter,
    replay_all: Annotated[bool, Option("--all", help="Replay every dead letter.")] = False,
    dry_run: Annotated[bool, Option("--dry-run", help=_DRY_RUN_HELP)] = False,
    rate: Annotated[str | None, Option(metavar="N/s", help=_RATE_HELP)] = None,
    to: Annotated[str | None, Option("--to", metavar="QUEUE", help=_TO_HELP)] = None,
    as_json: Annotated[bool, Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Send dead letters back where their producer sent them, and reset their keys.

    Takes the live dead letters the filters match (all of them must), or --all.
    Each copy goes to the letter's original exchange with its original routing
    key (the work queue when the producer used the default exchange), unless
    --to names a queue; the producer's headers go with it. A dead letter is
    ended only once its copy was confirmed: a copy no queue took leaves it in
    the DLQ and counts as failed (exit 1). Keys are reset for max-attempts,
    permanent-error and poison; the other reasons never wrote the key's state.
    """
    if filters.empty == (not replay_all):
        fail(_CHOOSE, EXIT_USAGE)
    pace = _rate(rate)
    if dry_run:
        _dry_run(filters, to, as_json)
        return

    async def run(container: Container) -> replays.ReplayReport:
        # The store first: one that cannot be reached stops the run before any
        # dead letter is read, let alone sent.
        store = await open_store(container)

        async def send(connection: AbstractConnection, names: Topology) -> replays.ReplayReport:
            return await replays.replay(
                connection, names, filters, store.reset,
                to=to, rate=pace, archive_retention=_retention(container),
            )  # fmt: skip

        return await _with_log(container, send)

    report = run_with_container(run)
    if as_json:
        echo_json(asdict(report))
    else:
        typer.echo(report.summary())
    if report.failed or report.stopped:
        raise typer.Exit(EXIT_FAILURE)


def register(app: typer.Typer) -> None:
    """Add the ``dlq`` group to the ``semel`` application."""
    group = typer.Typer(
        help="Look at, group, replay, discard, archive, export and import dead letters.",
        no_args_is_help=True,
    )
    group.command("list")(list_command)
    group.command("groups")(groups_command)
    group.command("replay")(replay_command)
    register_manage(group)
    app.add_typer(group, name="dlq")

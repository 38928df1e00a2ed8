"""The operator commands: ``semel publish``, ``semel dlq list`` and ``semel dlq replay``.

``consumer.cli`` imports this module at its end and calls :func:`register`,
so the helpers of ``consumer.cli`` are imported inside the commands, once
that module has finished loading.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, TypeVar

import aio_pika
import orjson
import typer
from aio_pika.abc import AbstractChannel
from aiormq.exceptions import AMQPError, ChannelInvalidStateError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text
from typer import Option

from consumer import dlq, publish, topology
from consumer.message import KeySource
from consumer.names import Reason
from settings import ConfigError, Settings, load_settings
from stores.base import JSON, Store

T = TypeVar("T")

CONNECT_TIMEOUT = 15.0  # seconds to reach the broker
TABLE_KEY_WIDTH = 40
TABLE_ERROR_WIDTH = 60
TABLE_MIN_ERROR_WIDTH = 12
_COLUMNS = ("reason", "key", "attempts", "error", "age", "routing key")
_ERROR_COLUMN = _COLUMNS.index("error")
_BROKER_ERRORS = (AMQPError, ChannelInvalidStateError, OSError)  # TimeoutError is an OSError


def _fail(message: str, usage: bool = False) -> None:
    from consumer import cli

    cli.fail(message, cli.EXIT_USAGE if usage else cli.EXIT_FAILURE)


def _settings() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        _fail(str(exc), usage=True)
        raise AssertionError("unreachable") from None


def _guarded(call: Callable[[], T]) -> T:
    """Run ``call``; broker trouble becomes one line and exit 1, a topology mismatch exit 2."""
    try:
        return call()
    except topology.TopologyMismatch as exc:
        _fail(str(exc), usage=True)
    except _BROKER_ERRORS as exc:
        _fail(f"broker: {type(exc).__name__}: {exc}")
    raise AssertionError("unreachable")


@asynccontextmanager
async def _broker(settings: Settings, *, declare: bool = True) -> AsyncIterator[AbstractChannel]:
    """A publisher-confirm channel, after declaring the topology (idempotent)."""
    # The client libraries log what they then raise; the command prints that as
    # its one error line, so their records must not reach Python's last-resort
    # stderr handler.
    for name in ("aiormq", "aio_pika"):
        client_log = logging.getLogger(name)
        if not client_log.handlers:
            client_log.addHandler(logging.NullHandler())
    connection = await aio_pika.connect(settings.amqp_url, timeout=CONNECT_TIMEOUT)
    async with connection:
        if declare:
            await topology.declare(connection, settings)
        yield await connection.channel(publisher_confirms=True, on_return_raises=True)


def _echo_json(data: object) -> None:
    typer.echo(orjson.dumps(data).decode())


# -- semel publish -------------------------------------------------------------------------


def _read_body(text: str | None) -> JSON:
    if text is None:
        return None
    try:
        raw = Path(text[1:]).read_bytes() if text.startswith("@") else text.encode()
        return json.loads(raw)
    except OSError as exc:
        _fail(f"--body: cannot read {text[1:]!r}: {exc.strerror}", usage=True)
    except ValueError as exc:  # never echo the body itself: it may hold personal data
        _fail(f"--body is not JSON: {str(exc).split(':')[0]}", usage=True)
    return None


@contextmanager
def _progress_bar(total: int, enabled: bool) -> Iterator[Callable[[], None]]:
    if not enabled:
        yield lambda: None
        return
    columns = (TextColumn("confirms"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("publish", total=total)
        yield lambda: bar.advance(task)


def publish_command(
    count: Annotated[int, Option("--count", "-n", min=1, help="Messages (keys) to publish.")] = 1,
    duplicates: Annotated[
        float, Option(min=0.0, max=1.0, help="Fraction of messages sent again, same key and body.")
    ] = 0.0,
    concurrent_copies: Annotated[
        int,
        Option(min=1, help="Copies of each message sent back to back, to meet a key in progress."),
    ] = 1,
    key: Annotated[str | None, Option(help="One fixed key for every message.")] = None,
    key_prefix: Annotated[
        str | None, Option(help="Keys are PREFIX-1..PREFIX-N (default: a random run id).")
    ] = None,
    body: Annotated[
        str | None, Option(help="JSON body, or @file (default: an order.paid event).")
    ] = None,
    routing_key: Annotated[str, Option(help="Routing key on SEMEL_EXCHANGE.")] = "order.paid",
    rate: Annotated[
        float, Option(min=0.0, help="Messages per second; 0: as fast as confirms allow.")
    ] = 0.0,
    bad: Annotated[
        list[publish.BadKind] | None,
        Option(
            "--bad",
            metavar="KIND",
            help="Send this bad input instead (repeatable; kinds listed above).",
            show_default=False,
        ),
    ] = None,
    declare: Annotated[bool, Option(help="Declare semel's topology first.")] = True,
    progress: Annotated[
        bool | None,
        Option(
            help="Show a progress bar (default: when stdout is a terminal).", show_default=False
        ),
    ] = None,
    as_json: Annotated[bool, Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Publish test messages with publisher confirms; exit 1 if any was returned or nacked.

    Bad inputs for --bad: not-json, invalid-utf8, empty-body, json-array,
    json-scalar, too-large, missing-key, empty-key, long-key,
    non-printable-key, non-string-key, wrong-content-type, key-reuse.
    """
    if key is not None and key_prefix is not None:
        _fail("give --key or --key-prefix, not both", usage=True)
    settings = _settings()
    plan = publish.PublishPlan(
        count=count,
        duplicates=duplicates,
        concurrent_copies=concurrent_copies,
        key=key,
        body=_read_body(body),
        bad=tuple(dict.fromkeys(bad or ())),
        **({"key_prefix": key_prefix} if key_prefix else {}),
    )
    try:
        messages = publish.build_messages(
            plan, KeySource.parse(settings.key_source), settings.max_body_bytes
        )
    except publish.PlanError as exc:
        _fail(str(exc), usage=True)
        return
    show = progress if progress is not None else sys.stdout.isatty()

    async def run() -> publish.PublishReport:
        async with _broker(settings, declare=declare) as channel:
            exchange = await channel.get_exchange(settings.exchange, ensure=True)
            with _progress_bar(len(messages), show) as advance:
                return await publish.publish_all(
                    exchange, messages, routing_key, rate=rate, on_settled=advance
                )

    report = _guarded(lambda: asyncio.run(run()))
    if as_json:
        _echo_json(asdict(report) | {"key_prefix": None if key else plan.key_prefix})
    else:
        typer.echo(report.summary())
    if not report.ok:
        raise typer.Exit(1)


# -- semel dlq list / replay ---------------------------------------------------------------


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


def _table(letters: list[dlq.DeadLetter], now: datetime, width: int) -> Table:
    """One line per dead letter; the error column gives way on a narrow terminal."""
    rows = [
        [
            _shown(letter.reason, TABLE_KEY_WIDTH),
            _shown(letter.key, TABLE_KEY_WIDTH),
            "-" if letter.attempts is None else str(letter.attempts),
            letter.error or "",
            _age(letter.age(now)),
            _shown(letter.routing_key, TABLE_KEY_WIDTH),
        ]
        for letter in letters
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


def dlq_list_command(
    limit: Annotated[int, Option(min=1, help="Show at most this many dead letters.")] = 50,
    as_json: Annotated[bool, Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show the dead letters without removing any from the DLQ."""
    settings = _settings()

    async def run() -> dlq.Listing:
        async with _broker(settings) as channel:
            return await dlq.list_dead_letters(channel, settings, limit)

    listing = _guarded(lambda: asyncio.run(run()))
    now = datetime.now(UTC)
    if as_json:
        letters = [letter.as_json(now) for letter in listing.letters]
        _echo_json({"depth": listing.depth, "dead_letters": letters})
        return
    console = Console()
    if listing.letters:
        console.print(_table(listing.letters, now, console.width))
    typer.echo(f"{len(listing.letters)} of {listing.depth} dead letters shown")


def dlq_replay_command(
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
        _fail("give exactly one of --key, --reason or --all", usage=True)
    selection = dlq.Selection(key=key, reason=reason, everything=replay_all)

    async def run(store: Store) -> dlq.ReplayReport:
        settings = load_settings()  # already validated by the container
        async with _broker(settings) as channel:
            return await dlq.replay(channel, settings, selection, store.reset)

    from consumer.cli import run_with_store

    report = _guarded(lambda: run_with_store(run))
    if as_json:
        _echo_json(asdict(report))
    else:
        typer.echo(report.summary())
    if report.failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``publish`` and the ``dlq`` group to the ``semel`` application."""
    app.command("publish")(publish_command)
    group = typer.Typer(help="Look at and replay dead letters.", no_args_is_help=True)
    group.command("list")(dlq_list_command)
    group.command("replay")(dlq_replay_command)
    app.add_typer(group, name="dlq")

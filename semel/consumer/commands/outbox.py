"""``semel outbox list``: what waits in the outbox, and why.

The counts come first, then the oldest unsent messages, each with why it is
still there: ``waiting`` (due; no relay has taken it yet), ``back-off``
(the broker refused it, and the relay tries again later) or ``blocked``
(per-key order: an older message of its key is backing off), and how the
broker refused it last (``unroutable``, ``nacked``, ``exchange not found``). Bodies
are never shown. The statements are
:mod:`semel.stores.postgres.outbox_status`; they read ``SEMEL_OUTBOX_TABLE``
through ``SEMEL_POSTGRES_DSN`` whatever ``SEMEL_STORE`` and
``SEMEL_TRANSACTIONAL`` say, since the outbox lives there either way.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from datetime import UTC
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer import Option

from semel.consumer.commands.common import echo_json, run_with_container
from semel.consumer.container import Container
from semel.consumer.errors import ConfigurationError
from semel.consumer.ops.outbox_watch import duration
from semel.settings import OutboxOrdering

if TYPE_CHECKING:
    from semel.stores.postgres.outbox_status import OutboxReport, OutboxSummary, WaitingMessage

CELL_WIDTH = 40  # characters of a key, exchange or routing key shown in the table
PIPED_WIDTH = 220  # a table piped to a file or grep: wide enough for every column
# Why first: on a narrow terminal the names on the right give way, never the why.
_COLUMNS = (
    "id", "why", "last refusal", "next attempt", "attempts", "age",
    "key/group", "routing key", "exchange", "message id",
)  # fmt: skip
_NAMES = {"key/group", "routing key", "exchange", "message id"}  # what may be cut short


def _status_module() -> ModuleType:
    """The status statements, imported only when asked for: they need psycopg."""
    try:
        return importlib.import_module("semel.stores.postgres.outbox_status")
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("semel"):
            raise
        raise ConfigurationError(
            f"the outbox lives in PostgreSQL, whose client is not installed here "
            f"(no module {exc.name!r}): pip install 'semel[postgres]'"
        ) from None


def why(message: WaitingMessage, per_key: bool) -> str:
    """``back-off`` while a refused message waits out its delay; ``blocked`` when
    per-key order holds it behind an older message of its key that does; else
    ``waiting``."""
    if message.backing_off:
        return "back-off"
    return "blocked" if per_key and message.behind_back_off else "waiting"


def _cell(value: str, width: int = CELL_WIDTH) -> Text:
    # Text, not str: a key must never be read as rich markup.
    if not value.isprintable():
        value = value.encode("unicode_escape").decode("ascii")
    return Text(value if len(value) <= width else value[: width - 1] + "…")


def _counts(report: OutboxReport) -> list[tuple[str, str]]:
    summary = report.summary
    oldest = "-" if summary.oldest_age is None else duration(summary.oldest_age)
    return [
        ("outbox table", report.table),
        ("unsent", str(summary.unsent)),
        ("due now", str(summary.due)),
        ("backing off", str(summary.backing_off)),
        ("refused by the broker", str(summary.refused)),
        ("unroutable", str(summary.unroutable)),
        (f"older than {duration(summary.stale_after)}", str(summary.stale)),
        ("oldest unsent", oldest),
    ]


def _table(waiting: list[WaitingMessage], per_key: bool) -> Table:
    """One line per message."""
    table = Table(box=box.SIMPLE_HEAD)
    for title in _COLUMNS:
        table.add_column(title, no_wrap=title not in _NAMES, overflow="ellipsis")
    for m in waiting:
        refusal = m.refusal
        table.add_row(
            Text(str(m.id)),
            Text(why(m, per_key)),
            Text("-" if refusal is None else refusal.value),
            Text(f"in {duration(math.ceil(m.next_attempt_in))}" if m.backing_off else "now"),
            Text(str(m.attempts)),
            Text(duration(m.age)),
            _cell(m.key),
            _cell(m.routing_key),
            _cell(m.exchange or "(default)"),
            Text(m.message_id),
        )
    return table


def _counts_json(summary: OutboxSummary) -> dict[str, Any]:
    return {
        "unsent": summary.unsent,
        "due": summary.due,
        "backing_off": summary.backing_off,
        "refused": summary.refused,
        "unroutable": summary.unroutable,
        "stale": summary.stale,
        "stale_after_seconds": summary.stale_after,
        "oldest_age_seconds": summary.oldest_age,
    }


def _message_json(m: WaitingMessage, per_key: bool) -> dict[str, Any]:
    refusal = m.refusal
    return {
        "id": m.id,
        "message_id": m.message_id,
        "exchange": m.exchange,
        "routing_key": m.routing_key,
        "key": m.key,
        "age_seconds": m.age,
        "attempts": m.attempts,
        "next_attempt_at": m.next_attempt_at.astimezone(UTC).isoformat(),
        "next_attempt_in_seconds": max(0.0, m.next_attempt_in),
        "why": why(m, per_key),
        "refusal": None if refusal is None else refusal.value,
        "last_error": m.last_error,
    }


def list_command(
    limit: Annotated[int, Option(min=1, help="Show at most this many unsent messages.")] = 50,
    as_json: Annotated[bool, Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show the outbox's counts and its oldest unsent messages, with why each waits."""

    async def run(container: Container) -> tuple[OutboxReport, bool]:
        settings = container.settings()
        status = _status_module()
        report: OutboxReport = await status.report(
            status.connecting(settings.postgres_dsn),
            settings.outbox_table,
            limit=limit,
            stale_after=settings.outbox_stale_after,
        )
        return report, settings.outbox_ordering is OutboxOrdering.PER_KEY

    report, per_key = run_with_container(run)
    if as_json:
        waiting = [_message_json(m, per_key) for m in report.waiting]
        echo_json(
            {"table": report.table, "counts": _counts_json(report.summary), "waiting": waiting}
        )
        return
    width = max(len(name) for name, _ in _counts(report))
    for name, value in _counts(report):
        typer.echo(f"{name:<{width}}  {value}")
    if report.waiting:
        # Piped (a log, grep), rich would cut the rows to 80 columns: the ids matter more.
        # (COLUMNS, when set, still decides.)
        wide = sys.stdout.isatty() or "COLUMNS" in os.environ
        console = Console() if wide else Console(width=PIPED_WIDTH)
        console.print(_table(report.waiting, per_key))
    typer.echo(f"{len(report.waiting)} of {report.summary.unsent} unsent messages shown")


def register(app: typer.Typer) -> None:
    """Add the ``outbox`` group (``list``) to the ``semel`` application."""
    group = typer.Typer(help="Look at the outbox's unsent messages.", no_args_is_help=True)
    group.command("list")(list_command)
    app.add_typer(group, name="outbox")

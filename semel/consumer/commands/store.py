"""The store's commands: ``semel migrate``, ``semel inspect KEY`` and ``semel purge``."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any

import orjson
import typer

from semel.consumer.commands.common import (
    echo_json,
    fail,
    open_store,
    run_with_container,
    run_with_store,
)
from semel.consumer.container import Container
from semel.consumer.outboxes import migrates_outbox, open_outbox
from semel.consumer.runtime.purge import PurgeReport, purge
from semel.stores.base import Store


async def migrate(container: Container) -> list[str]:
    """The store's set-up, and the outbox table's wherever semel has a PostgreSQL
    database (:func:`semel.consumer.outboxes.migrates_outbox`)."""
    warnings = await (await open_store(container)).migrate()
    settings = container.settings()
    if migrates_outbox(settings):
        outbox = await open_outbox(settings)
        try:
            await outbox.migrate()
        finally:
            await outbox.close()
    return warnings


def migrate_command() -> None:
    """Create the store's table, index and TTL settings, and the outbox table with
    PostgreSQL (safe to run twice)."""
    warnings = run_with_container(migrate)
    for warning in warnings:
        typer.echo(f"semel: warning: {warning}", err=True)
    typer.echo("store ready")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(type(value).__name__)


def inspect_command(
    key: Annotated[str, typer.Argument(help="the idempotency key, without prefix")],
) -> None:
    """Print a key's record as JSON."""
    record = run_with_store(lambda store: store.get(key))
    if record is None:
        fail(f"no record for key {key!r}")
    data = orjson.dumps(asdict(record), default=_json_default, option=orjson.OPT_INDENT_2)
    typer.echo(data.decode())


def purge_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Delete keys past retention and outbox messages sent before it (safe any time)."""

    async def run(store: Store) -> tuple[str, PurgeReport]:
        return store.backend, await purge(store)

    backend, report = run_with_store(run)
    if as_json:
        echo_json(asdict(report))
    else:
        typer.echo(report.summary(backend))


def register(app: typer.Typer) -> None:
    """Add ``migrate``, ``inspect`` and ``purge`` to the ``semel`` application."""
    app.command("migrate")(migrate_command)
    app.command("inspect")(inspect_command)
    app.command("purge")(purge_command)

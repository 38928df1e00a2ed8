"""The ``semel`` command line.

Exit codes: 0 success, 2 bad usage or configuration, 1 anything else.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import datetime
from typing import Any, TypeVar

import orjson
import typer

from consumer.container import Container, shutdown
from consumer.serve import StartupError
from consumer.serve import consume as run_consumer
from settings import ConfigError, redact
from stores.base import Store
from stores.errors import StoreError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

app = typer.Typer(
    name="semel",
    help="Run a RabbitMQ handler effectively once per idempotency key.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

T = TypeVar("T")


def fail(message: str, code: int = EXIT_FAILURE) -> None:
    """Print one line to stderr and exit; secrets are masked on the way."""
    typer.echo(f"semel: error: {redact(message)}", err=True)
    raise typer.Exit(code)


def run_with_store(action: Callable[[Store], Awaitable[T]]) -> T:
    """Build the container, open the selected store, run ``action``, close."""

    async def _run() -> T:
        container = Container()
        container.settings()  # a bad setting fails here, before anything opens
        try:
            store = await container.store()
            return await action(store)
        finally:
            await shutdown(container)

    try:
        return asyncio.run(_run())
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    except StoreError as exc:
        fail(str(exc))
    raise AssertionError("unreachable")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(type(value).__name__)


@app.command()
def migrate() -> None:
    """Create the store's table, index and TTL settings (safe to run twice)."""
    warnings = run_with_store(lambda store: store.migrate())
    for warning in warnings:
        typer.echo(f"semel: warning: {warning}", err=True)
    typer.echo("store ready")


@app.command()
def inspect(key: str = typer.Argument(..., help="the idempotency key, without prefix")) -> None:
    """Print a key's record as JSON."""
    record = run_with_store(lambda store: store.get(key))
    if record is None:
        fail(f"no record for key {key!r}")
        return
    data = orjson.dumps(asdict(record), default=_json_default, option=orjson.OPT_INDENT_2)
    typer.echo(data.decode())


def _fast_loop() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed: the worker spends much of each delivery in the
    event loop's own machinery (transports, callbacks), which uvloop does in C."""
    try:
        import uvloop
    except ImportError:  # e.g. Windows: asyncio's own loop
        return None
    return uvloop.new_event_loop


@app.command()
def consume() -> None:
    """Run the consumer until SIGTERM / SIGINT (the Procfile's worker)."""
    try:
        with asyncio.Runner(loop_factory=_fast_loop()) as runner:
            code = runner.run(run_consumer())
    except StartupError as exc:
        fail(str(exc), exc.code)
        return
    raise typer.Exit(code)


from consumer import purge, tools_cli  # noqa: E402 - needs app, fail and run_with_store above

tools_cli.register(app)
purge.register(app)


def main() -> None:
    """Entry point of the ``semel`` script."""
    try:
        app()
    except ConfigError as exc:  # raised while building the container, outside run_with_store
        typer.echo(f"semel: error: {redact(str(exc))}", err=True)
        sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    main()

"""The ``semel`` command line: the typer application, its command groups, its entry point.

Each group lives in a module of its own and adds itself with ``register(app)``:
:mod:`~semel.consumer.commands.consume`, :mod:`~semel.consumer.commands.store` (migrate,
inspect, purge), :mod:`~semel.consumer.commands.publish`, :mod:`~semel.consumer.commands.dlq`
and :mod:`~semel.consumer.commands.queues`. Exit codes: 0 success, 2 bad usage or
configuration, 1 anything else (:mod:`semel.consumer.errors`).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from semel.consumer.commands import consume, dlq, outbox, publish, queues, relay, store

app = typer.Typer(
    name="semel",
    help="Run a RabbitMQ handler effectively once per idempotency key.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def semel_version() -> str:
    """The installed distribution's version (a source tree never installed has none)."""
    try:
        return version("semel")
    except PackageNotFoundError:
        return "0+unknown"


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"semel {semel_version()}")
        raise typer.Exit


@app.callback()
def options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print semel's version and exit.",
        ),
    ] = False,
) -> None:
    """Options of ``semel`` itself, before the command."""


for group in (store, consume, publish, dlq, queues, outbox, relay):
    group.register(app)


def main() -> None:
    """Entry point of the ``semel`` script."""
    app()


if __name__ == "__main__":
    main()

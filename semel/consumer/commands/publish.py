"""``semel publish``: send test traffic to a deployment and report what the broker said.

The options become a :class:`~semel.consumer.commands.traffic.PublishPlan`; the
messages are built (and refused as bad usage) before the broker is reached,
then sent by :func:`~semel.consumer.commands.traffic.publish_all` with a progress
bar on stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from typer import Option

from semel.consumer.commands.bad_inputs import BadKind
from semel.consumer.commands.common import confirm_channel, echo_json, fail, run_with_container
from semel.consumer.commands.traffic import PublishPlan, PublishReport, build_messages, publish_all
from semel.consumer.container import Container
from semel.consumer.errors import EXIT_FAILURE, EXIT_USAGE
from semel.stores.base import JSON


def _read_body(text: str | None) -> JSON:
    if text is None:
        return None
    try:
        raw = Path(text[1:]).read_bytes() if text.startswith("@") else text.encode()
        return json.loads(raw)
    except OSError as exc:
        fail(f"--body: cannot read {text[1:]!r}: {exc.strerror}", EXIT_USAGE)
    except ValueError as exc:  # never echo the body itself: it may hold personal data
        fail(f"--body is not JSON: {str(exc).split(':')[0]}", EXIT_USAGE)


@contextmanager
def _progress_bar(total: int, enabled: bool) -> Iterator[Callable[[], None]]:
    if not enabled:
        yield lambda: None
        return
    columns = (TextColumn("confirms"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    # On stderr, so that stdout stays the summary alone (--json can be piped).
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
        list[BadKind] | None,
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
    """Publish test messages with publisher confirms; exit 1 unless every one was confirmed.

    A publish left without an answer (the broker node lost, say) stops the
    run; the summary counts it failed (--json lists its key) and the rest
    not sent.

    Bad inputs for --bad: not-json, invalid-utf8, empty-body, json-array,
    json-scalar, too-large, missing-key, empty-key, long-key,
    non-printable-key, non-string-key, wrong-content-type, key-reuse.
    """
    if key is not None and key_prefix is not None:
        fail("give --key or --key-prefix, not both", EXIT_USAGE)
    plan = PublishPlan(
        count=count,
        duplicates=duplicates,
        concurrent_copies=concurrent_copies,
        key=key,
        body=_read_body(body),
        bad=tuple(dict.fromkeys(bad or ())),
        **({"key_prefix": key_prefix} if key_prefix else {}),
    )
    show = progress if progress is not None else sys.stdout.isatty()

    async def run(container: Container) -> PublishReport:
        rules = container.rules()
        # Built before connecting: a plan that cannot be sent is bad usage (a PlanError).
        messages = build_messages(plan, rules.source, rules.max_body_bytes)
        async with confirm_channel(container, declare_topology=declare) as channel:
            exchange = await channel.get_exchange(container.topology().exchange, ensure=True)
            with _progress_bar(len(messages), show) as advance:
                return await publish_all(
                    exchange, messages, routing_key, rate=rate, on_settled=advance
                )

    report = run_with_container(run)
    if as_json:
        echo_json(asdict(report) | {"key_prefix": None if key else plan.key_prefix})
    else:
        typer.echo(report.summary())
    if report.error is not None:  # the summary says how many; this line says why
        fail(f"broker: {report.error}")
    if not report.ok:
        raise typer.Exit(EXIT_FAILURE)


def register(app: typer.Typer) -> None:
    """Add ``publish`` to the ``semel`` application."""
    app.command("publish")(publish_command)

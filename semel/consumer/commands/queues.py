"""``semel queues``: the depth of semel's queues as the management API sees them, and
the messages the broker holds for dead-lettering (``messages_dlx``), with what to do.

A held message shows in no ready or unacknowledged count and no consumer can
take it; only the management API counts it. Exit 1 while any is held, so the
command can be a check (cron, a Kubernetes probe, CI after a deploy).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Annotated

import typer
from typer import Option

from semel.consumer.broker.management import (
    ManagementError,
    QueueState,
    management_url_of,
    queue_states,
)
from semel.consumer.broker.topology import queue_specs
from semel.consumer.commands.common import echo_json, fail, run_with_container
from semel.consumer.container import Container
from semel.consumer.errors import EXIT_FAILURE

MANAGEMENT_URL_ENV = "SEMEL_MANAGEMENT_URL"

ADVICE = (
    "The broker holds {held} message(s) of {queues} for dead-lettering: no consumer "
    "sees them until the broker moves them. If the count does not fall within a "
    "minute: check that the dead-letter target exists and is bound (`semel consume` "
    "declares it); otherwise the queue's dead-letter worker is stuck (a RabbitMQ "
    "defect after leader changes close together): move the queue's leader "
    "(`rabbitmq-upgrade drain` then `rabbitmq-upgrade revive` on the node that leads "
    "it, or restart that node), which restarts it. Nothing is lost meanwhile."
)


def held(states: list[QueueState]) -> list[QueueState]:
    return [state for state in states if state.held_for_dead_lettering]


def queues_command(
    management_url: Annotated[
        str | None,
        Option(
            envvar=MANAGEMENT_URL_ENV,
            help="The management API, http(s)://user:password@host:port/vhost "
            "(default: the first SEMEL_AMQP_URL host on port 15672, same credentials).",
        ),
    ] = None,
    as_json: Annotated[bool, Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show semel's queues; exit 1 if the broker holds any message for dead-lettering."""

    async def run(container: Container) -> list[QueueState]:
        settings = container.settings()
        url = (
            management_url
            or settings.management_url
            or management_url_of(settings.amqp_addresses[0])
        )
        names = [spec.name for spec in queue_specs(container.topology())]
        try:
            return await asyncio.to_thread(queue_states, url, names)
        except ManagementError as exc:
            fail(str(exc))

    states = run_with_container(run)
    stuck = held(states)
    if as_json:
        echo_json([asdict(state) for state in states])
    else:
        typer.echo(f"{'queue':<48} {'ready':>8} {'unacked':>8} {'held':>8}")
        for state in states:
            if not state.exists:
                typer.echo(f"{state.name:<48} {'(not declared)':>26}")
                continue
            typer.echo(
                f"{state.name:<48} {state.ready:>8} {state.unacknowledged:>8} "
                f"{state.held_for_dead_lettering:>8}"
            )
    if stuck:
        count = sum(state.held_for_dead_lettering for state in stuck)
        typer.echo(ADVICE.format(held=count, queues=", ".join(s.name for s in stuck)), err=True)
        raise typer.Exit(EXIT_FAILURE)


def register(app: typer.Typer) -> None:
    """Add ``queues`` to the ``semel`` application."""
    app.command("queues")(queues_command)

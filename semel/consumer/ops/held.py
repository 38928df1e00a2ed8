"""Messages the broker holds for dead-lettering in semel's queues, as a metric.

Only the management API counts them (``messages_dlx``): they are in no ready
or unacknowledged count, and no consumer can take them. semel moves its own
messages, so a non-zero value means the broker dead-letters something
itself (``Q``'s delivery limit, or delay queues an earlier semel declared)
and may be stuck doing it; ``semel queues`` says what to do. Asked only when
``SEMEL_MANAGEMENT_URL`` is set: a worker must not depend on a plugin an
operator may not run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import structlog

from semel.consumer.broker.management import ManagementError, QueueState, queue_states
from semel.consumer.tasks import running

HELD_INTERVAL = 30.0  # seconds between two looks: a gauge for alerts, not for tracing

log = structlog.get_logger("semel.held")

Look = Callable[[str, list[str]], list[QueueState]]


async def watch_held(
    url: str,
    queues: list[str],
    held: Callable[[str, int], None],
    *,
    interval: float = HELD_INTERVAL,
    look: Look = queue_states,
) -> None:
    """Every ``interval`` seconds, tell ``held`` each queue's held count, until cancelled.

    A management API that cannot be asked is said once, and once again when it
    answers: a warning per round would flood the log of a worker that runs for
    weeks beside a broker whose plugin is off.
    """
    reachable = True
    while True:
        try:
            states = await asyncio.to_thread(look, url, queues)
        except ManagementError as exc:
            if reachable:
                log.warning("management API not asked", error=str(exc))
            reachable = False
        else:
            if not reachable:
                log.info("management API answers again")
            reachable = True
            for state in states:
                held(state.name, state.held_for_dead_lettering)
        await asyncio.sleep(interval)


async def held_watcher(
    url: str | None, queues: list[str], held: Callable[[str, int], None]
) -> AsyncIterator[None]:
    """The container's Resource: watch while the consumer runs, if a URL is configured."""
    async with running(None if url is None else watch_held(url, queues, held)):
        yield None

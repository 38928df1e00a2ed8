"""The outbox watch: how many messages wait for the relay, and for how long.

Wherever a relay runs, the relay calls the watch every few seconds; each
call reads the outbox's counts (a callable given to it), sets ``semel_outbox_unsent`` and
``semel_outbox_oldest_unsent_seconds``, and gives ``/readyz`` an ``outbox``
detail: ``ok``, or how many messages have waited longer than
``SEMEL_OUTBOX_STALE_AFTER`` and what the broker said of them. A warning is
logged when such messages first show, and a line when they are gone: once
per episode, not once per look.

Stale messages leave ``/readyz`` at 200. Readiness decides whether this
process gets traffic; the outbox is one table shared by every replica, so
all of them would turn unready together and take the whole service out of
its load balancer, for a cause that no restart and no removal cures (a relay
not running, a routing key no queue is bound to, an exchange missing). A
rolling update that ships the fix would wait forever for its first replica
to become ready. So the detail and the gauges make it seen, and an alert on
the gauge makes it acted on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from semel.consumer.ops.metrics import OutboxGauges

LOOK_TIMEOUT = 10.0  # seconds a look may take before it counts as failed
OK = "ok"

log = structlog.get_logger("semel.outbox")


class Summary(Protocol):
    """The counts the watch needs (:class:`semel.stores.postgres.outbox_status.OutboxSummary`)."""

    @property
    def unsent(self) -> int: ...
    @property
    def refused(self) -> int: ...
    @property
    def unroutable(self) -> int: ...
    @property
    def stale(self) -> int: ...
    @property
    def stale_after(self) -> float: ...
    @property
    def oldest_age(self) -> float | None: ...


Look = Callable[[], Awaitable[Summary]]


def duration(seconds: float) -> str:
    """``seconds`` as an operator reads it: ``42s``, ``5m02s``, ``3h07m``, ``2d04h``."""
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def stale_detail(summary: Summary) -> str:
    """The ``/readyz`` line for messages unsent longer than they should be."""
    oldest = duration(summary.oldest_age or 0.0)
    text = (
        f"{summary.stale} of {summary.unsent} unsent messages waiting longer than "
        f"{duration(summary.stale_after)}, the oldest {oldest}; "
    )
    if summary.refused:
        text += f"{summary.refused} refused by the broker ({summary.unroutable} unroutable)"
    else:
        text += "none refused: is a relay running, and reaching the broker?"
    return text + "; see `semel outbox list`"


class OutboxWatch:
    """The latest look at the outbox, as gauges and a detail line.

    Made only where a relay runs, so the gauges (registered by
    ``metrics.outbox_gauges()``) and the detail (``health.watch_outbox(watch.detail)``)
    exist nowhere else.
    """

    def __init__(self, look: Look, gauges: OutboxGauges, *, timeout: float = LOOK_TIMEOUT) -> None:
        self._look = look
        self._gauges = gauges
        self._timeout = timeout
        self._detail = "unknown: not read yet"
        self._stale = False  # within an episode of stale messages
        self._readable = True

    def detail(self) -> str:
        """``ok``, the stale messages, or why the outbox could not be read."""
        return self._detail

    async def look(self) -> None:
        """Read the counts once; a failure is logged once per outage and shown."""
        try:
            async with asyncio.timeout(self._timeout):
                summary = await self._look()
        except Exception as exc:  # the watch must outlive any one failed look
            if self._readable:
                log.warning("outbox not read", error=str(exc) or repr(exc))
            self._readable = False
            self._detail = f"unknown: the outbox could not be read ({str(exc) or repr(exc)})"
            return
        if not self._readable:
            log.info("outbox read again")
        self._readable = True
        self._gauges.unsent.set(summary.unsent)
        self._gauges.oldest_seconds.set(summary.oldest_age or 0.0)
        self._detail = stale_detail(summary) if summary.stale else OK
        if summary.stale and not self._stale:
            log.warning(
                "outbox messages unsent too long",
                stale=summary.stale,
                unsent=summary.unsent,
                oldest_seconds=round(summary.oldest_age or 0.0, 1),
                stale_after=summary.stale_after,
                refused=summary.refused,
                unroutable=summary.unroutable,
            )
        elif self._stale and not summary.stale:
            log.info("outbox caught up", unsent=summary.unsent)
        self._stale = bool(summary.stale)

    async def __call__(self, source: object = None) -> None:
        """Look once: what a running relay calls every few seconds with its outbox
        (``semel.consumer.outbox.runner.Watch``), which the look does not need."""
        await self.look()

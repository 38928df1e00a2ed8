"""The pipeline's fenced store writes after a claim, and how long each is retried."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from semel.consumer.backoff import Backoff
from semel.consumer.delivery.decide import describe
from semel.consumer.delivery.lease import Lease
from semel.stores.errors import StoreError, StoreUnavailable

T = TypeVar("T")
log = structlog.get_logger("semel.pipeline")

WRITE_BACKOFF = (0.05, 1.0)  # first and longest pause between store-write retries


async def write_fenced(
    lease: Lease, write: Callable[[], Awaitable[T]], *, past_lease: bool = False
) -> T:
    """A fenced store write under ``lease``, retried while the lease still holds.

    With ``past_lease`` it is retried until the store answers, and past any
    error that is not the store's answer (a bug in semel): a write after the
    handler's end is fenced, so written late it either lands (nobody took the
    key over) or is refused (somebody did). Giving up instead would hand the
    message back, and once the lease has expired its redelivery runs the
    handler again. The back-off is jittered, so writes that failed together do
    not retry together.
    """
    backoff = None  # built on the first failure: most writes never need it
    while True:
        try:
            return await write()
        except StoreUnavailable:
            backoff = backoff or Backoff(*WRITE_BACKOFF)
            if not past_lease and lease.remaining() <= backoff.pause:
                raise
        except StoreError:
            raise
        except Exception as exc:
            if not past_lease:
                raise
            backoff = backoff or Backoff(*WRITE_BACKOFF)
            log.error("store write raised, retried", key=lease.key, error=describe(exc))
        await backoff.wait()

"""The leases of plain handlers' running threads, and the process's end when one cannot be kept.

A plain handler runs on a thread that cannot be cancelled. Were its lease to
lapse while the thread ran on, another worker would take the key over and
run the handler beside it. So the process ends at once (exit code
:data:`semel.stores.errors.EXIT_LEASE_LOST`), and the thread with it, when a lease
held by a running thread comes within :data:`SAFETY_SHARE` of lapsing
unrenewed (the store silent), or the store answers that it was taken over.
Its deliveries are redelivered as after any crash.

The watch is a thread of its own, so neither a busy event loop nor one that
has stopped (the process on its way out) can delay it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn, Protocol

import structlog

from semel.stores.errors import EXIT_LEASE_LOST

# Share of the lease left when the process ends rather than let it lapse under a
# running thread: room for the watch to wake and the exit to land on a busy host.
SAFETY_SHARE = 1 / 6

log = structlog.get_logger("semel.threads")
_ending = threading.Lock()  # one line, one exit, whichever thread gets here first


class HeldLease(Protocol):
    """What the watch reads of a lease (see :class:`semel.consumer.delivery.lease.Lease`)."""

    key: str
    ttl: float

    def remaining(self) -> float:
        """Seconds until the lease lapses unless renewed (monotonic clock)."""


def end_process(key: str, why: str) -> NoReturn:
    """Say why in one line at error level, flushed, then end the process at once:
    no clean-up may run while the thread still could act."""
    if _ending.acquire(blocking=False):
        log.error(
            "handler thread's lease cannot be kept: exiting so the thread ends with the process",
            key=key,
            why=why,
            exit_code=EXIT_LEASE_LOST,
        )
        exit_now(EXIT_LEASE_LOST)
    while True:  # another thread is ending the process this instant
        time.sleep(1)


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` at once, output flushed: a running handler
    thread ends with it, not after the interpreter's clean-up."""
    for stream in (sys.stderr, sys.stdout):
        stream.flush()
    os._exit(code)


class ThreadLeases:
    """Leases held by running handler threads, watched from a thread of their own."""

    def __init__(self, end: Callable[[str, str], NoReturn] = end_process) -> None:
        self._end = end
        self._held: dict[int, tuple[HeldLease, Callable[[], None]]] = {}
        self._changed = threading.Condition()
        self._watch: threading.Thread | None = None

    def hold(self, lease: HeldLease, let_go: Callable[[], None]) -> Callable[[], None]:
        """Watch ``lease`` while its thread runs; the callable the thread calls as it ends.

        ``let_go`` stops the lease's renewals for good (see :meth:`let_go`).
        """
        token = id(lease)
        with self._changed:
            self._held[token] = (lease, let_go)
            if self._watch is None:
                self._watch = threading.Thread(
                    target=self._run, name="semel-thread-leases", daemon=True
                )
                self._watch.start()
            self._changed.notify()

        def ended() -> None:
            with self._changed:
                self._held.pop(token, None)

        return ended

    def any_running(self) -> bool:
        """Whether a handler thread still runs under a lease of this process."""
        with self._changed:
            return bool(self._held)

    def running(self, lease: HeldLease) -> bool:
        """Whether a thread still runs under ``lease``."""
        with self._changed:
            return id(lease) in self._held

    def lost(self, lease: HeldLease, why: str) -> None:
        """The store says ``lease`` is gone: end the process if its thread still runs."""
        if self.running(lease):
            self._end(lease.key, why)

    def let_go(self) -> list[str]:
        """The process is about to exit: stop renewing what running threads hold
        (the store is closing) and return their keys. Still watched: should the
        process outlive a lease, it ends first."""
        with self._changed:
            held = list(self._held.values())
        for _, let_go in held:
            let_go()
        return [lease.key for lease, _ in held]

    def _run(self) -> None:
        with self._changed:
            while True:
                wait: float | None = None
                for lease, _ in self._held.values():
                    left = lease.remaining() - lease.ttl * SAFETY_SHARE
                    if left <= 0:
                        self._end(
                            lease.key,
                            f"renewals unanswered: {max(lease.remaining(), 0):.2f}s "
                            f"of its {lease.ttl:g}s lease left",
                        )
                    wait = left if wait is None else min(wait, left)
                self._changed.wait(wait)


THREAD_LEASES = ThreadLeases()  # one per process: the process is what ends

"""Hooks at the steps of one delivery, for metrics and traces.

The pipeline tells an :class:`Observer` when a delivery starts and ends, when
its key is claimed and how it was settled. The base class does nothing, so a
pipeline built without observers pays for three empty calls. An observer
never changes what happens to a message: it only watches.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

from semel.consumer.delivery.decide import Applied, Settle
from semel.consumer.delivery.facts import Delivery
from semel.consumer.delivery.message import Incoming
from semel.stores.base import Claim

_NOTHING = contextlib.nullcontext()  # stateless, so one instance serves every delivery


class Observer:
    """Watches deliveries; every hook is a no-op here."""

    def delivery(self, message: Incoming) -> AbstractContextManager[object]:
        """Entered before anything is done with ``message``, left once it is settled."""
        return _NOTHING

    def claimed(self, claim: Claim, attempt: int) -> None:
        """The store answered the claim of a delivery's key."""

    def overrun(self) -> AbstractContextManager[object]:
        """Entered while a plain handler's thread runs past its time limit."""
        return _NOTHING

    def settled(self, delivery: Delivery, decision: Settle, applied: Applied) -> None:
        """``decision`` was applied to the broker; ``applied`` says how it went."""

    def admitting(self, limit: int) -> None:
        """At most ``limit`` deliveries go to the store at once from now on."""

"""Judging an outbox chaos run: pure functions over what it collected.

The orders table is the truth: a row exists if and only if its request's
transaction committed. Against it:

* *lost*: a committed order whose message id was never published (the tap
  queue, bound to the exchange for every routing key, holds every copy the
  broker routed);
* *wrong message id*: a key whose order row, outbox row, published copies,
  consumer executions or client answers name more than one message id;
* *rolled back, published*: a published copy of a key the client sent with
  ``"fail": true`` or of a key with no order row; and *staged without an
  order*: an outbox row whose key has no order row (the staging outlived its
  rolled-back transaction);
* *answered, not committed*: a 200/201 for a key with no order row;
* *unsent*: outbox rows still unsent after the drain;
* *not consumed*: committed keys the downstream consumer never completed.

Duplicate effects downstream are counted and explained by
:func:`tests.chaos.verdict.duplicates_of`; an unexplained one fails the run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tests.chaos.verdict import UNEXPLAINED, Duplicate
from tests.outbox_chaos.driver import Answer


@dataclass(frozen=True, slots=True)
class OutboxRow:
    key: str
    message_id: str
    sent: bool


@dataclass(frozen=True, slots=True)
class Copy:
    """One message the broker routed, as the tap queue holds it."""

    key: str
    message_id: str


@dataclass(slots=True)
class Verdict:
    committed: int
    rolled_back: int  # keys sent with "fail": true
    outbox_rows: int
    published: int  # distinct message ids in the tap
    copies: int  # copies in the tap, redeliveries of the relay included
    lost: list[str] = field(default_factory=list)
    wrong_id: list[str] = field(default_factory=list)
    rolled_back_published: list[str] = field(default_factory=list)
    staged_without_order: list[str] = field(default_factory=list)
    answered_not_committed: list[str] = field(default_factory=list)
    unsent: int = 0
    not_consumed: list[str] = field(default_factory=list)
    duplicates: list[Duplicate] = field(default_factory=list)

    def count(self, cause: str) -> int:
        return sum(1 for d in self.duplicates if d.cause == cause)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.wrong_id
            or self.rolled_back_published
            or self.staged_without_order
            or self.answered_not_committed
            or self.unsent
            or self.not_consumed
            or self.count(UNEXPLAINED)
        )


def judge(
    orders: Mapping[str, str],
    failing: set[str],
    outbox: Iterable[OutboxRow],
    tap: Iterable[Copy],
    consumed: Mapping[str, set[str]],
    answers: Mapping[str, list[Answer]],
    completed: set[str],
    duplicates: list[Duplicate],
) -> Verdict:
    """``orders``: key -> message id of each order row; ``failing``: keys sent with fail;
    ``consumed``: key -> message ids the consumer's executions ran under;
    ``completed``: keys the consumer's store holds as completed."""
    outbox, tap = list(outbox), list(tap)
    ids: dict[str, set[str]] = {key: {mid} for key, mid in orders.items()}
    for row in outbox:
        ids.setdefault(row.key, set()).add(row.message_id)
    for copy in tap:
        ids.setdefault(copy.key, set()).add(copy.message_id)
    for key, seen in consumed.items():
        ids.setdefault(key, set()).update(seen)
    for key, given in answers.items():
        ids.setdefault(key, set()).update(a.message_id for a in given if a.message_id)
    published = {copy.message_id for copy in tap}
    answered = {key for key, given in answers.items() if any(a.status < 300 for a in given)}
    return Verdict(
        committed=len(orders),
        rolled_back=len(failing),
        outbox_rows=len(outbox),
        published=len(published),
        copies=len(tap),
        lost=sorted(key for key, mid in orders.items() if mid not in published),
        wrong_id=sorted(key for key, seen in ids.items() if len(seen) > 1),
        rolled_back_published=sorted(
            {c.key for c in tap if c.key in failing or c.key not in orders}
        ),
        staged_without_order=sorted({row.key for row in outbox if row.key not in orders}),
        answered_not_committed=sorted(answered - orders.keys()),
        unsent=sum(1 for row in outbox if not row.sent),
        not_consumed=sorted(orders.keys() - completed),
        duplicates=duplicates,
    )


def copies_per_id(tap: Iterable[Copy]) -> Counter[str]:
    """How many times each message id was routed: more than once is the relay re-sending."""
    return Counter(copy.message_id for copy in tap)

"""Which dead letters an operator means, and what they have in common: pure, no I/O.

A :class:`LetterFilter` picks dead letters by what their headers say; the
commands list, group and replay what it matches. :func:`groups` gathers dead
letters by their fingerprint: the reason, and for a handler's failure the
exception's type and the handler's own frame (``x-semel-error-type``,
``x-semel-error-frame``, written by the worker; see
:mod:`semel.consumer.delivery.error_site`). Bad input (a malformed body, a
missing key, a payload mismatch ...) has no exception: its reason is its group.

Why the fingerprint travels in the dead letter's headers, and the store gets
nothing new: a dead letter describes itself, so grouping reads nothing but the
DLQ (no store round trip per letter, none at all for bad input whose key the
store never kept, and it works with the store down or the key forgotten past
its retention); the store's record of a failed key already keeps the error
text, which is all it needs to answer a duplicate. Both headers are bounded
(``names.ERROR_TYPE_LIMIT``, ``names.ERROR_FRAME_LIMIT``) and never hold any
of the body.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from semel.consumer.broker.dead_letters import DlqEntry
from semel.consumer.delivery.routes import topic_matches
from semel.consumer.names import Reason

# The reasons a handler's exception leads to: only these have a type and frame.
HANDLER_REASONS = frozenset({Reason.MAX_ATTEMPTS.value, Reason.PERMANENT_ERROR.value})
GROUP_ID_LENGTH = 10  # hex characters of the sha256 of the fingerprint
# The type a dead letter written before the fingerprint headers names in its
# error text (``describe``: "Type: message"), so an existing DLQ groups too.
_TYPE_IN_ERROR = re.compile(r"([A-Za-z_][\w.]*)(?::|$)")


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What dead letters of one group share."""

    reason: str | None
    error_type: str | None = None
    frame: str | None = None

    @property
    def group_id(self) -> str:
        """A short id that stays the same for the same fingerprint, run after run."""
        parts = (self.reason or "", self.error_type or "", self.frame or "")
        digest = hashlib.sha256("\x1f".join(parts).encode("utf-8", "backslashreplace"))
        return digest.hexdigest()[:GROUP_ID_LENGTH]


def fingerprint(entry: DlqEntry) -> Fingerprint:
    """The reason, plus the exception's type and frame when a handler failed."""
    if entry.reason not in HANDLER_REASONS:
        return Fingerprint(entry.reason)
    error_type = entry.error_type
    if error_type is None and entry.error is not None:  # a dead letter from before the headers
        found = _TYPE_IN_ERROR.match(entry.error)
        error_type = found.group(1) if found else None
    return Fingerprint(entry.reason, error_type, entry.error_frame)


def group_id(entry: DlqEntry) -> str:
    return fingerprint(entry).group_id


@dataclass(frozen=True, slots=True)
class LetterFilter:
    """Dead letters matching every condition given (none given: all of them).

    ``reasons`` and ``group_ids`` match any of theirs; ``routing_key`` is a
    topic pattern (``*`` one word, ``#`` any), so a plain routing key matches
    itself; ``error`` is a case-insensitive substring of ``x-semel-error``;
    ``since`` (inclusive) and ``until`` (exclusive) bound when it was
    dead-lettered and must be aware. A condition on a header a dead letter
    lacks does not match it.
    """

    reasons: frozenset[str] = frozenset()
    group_ids: frozenset[str] = frozenset()
    key: str | None = None
    key_prefix: str | None = None
    routing_key: str | None = None
    error: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    min_attempts: int | None = None
    _error_folded: str | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        for instant in (self.since, self.until):
            if instant is not None and instant.tzinfo is None:
                raise ValueError("since and until must be aware datetimes")
        folded = None if self.error is None else self.error.casefold()
        object.__setattr__(self, "_error_folded", folded)
        object.__setattr__(self, "group_ids", frozenset(g.lower() for g in self.group_ids))

    @property
    def empty(self) -> bool:
        """No condition at all: matches every dead letter."""
        return self == LetterFilter()

    def matches(self, entry: DlqEntry) -> bool:
        return (
            self._names(entry)
            and self._when(entry.dead_lettered_at)
            and (self.min_attempts is None or (entry.attempts or 0) >= self.min_attempts)
            and (self._error_folded is None or self._error_folded in (entry.error or "").casefold())
            and (not self.group_ids or group_id(entry) in self.group_ids)
        )

    def _names(self, entry: DlqEntry) -> bool:
        key = entry.key
        return (
            (not self.reasons or entry.reason in self.reasons)
            and (self.key is None or key == self.key)
            and (self.key_prefix is None or (key is not None and key.startswith(self.key_prefix)))
            and (
                self.routing_key is None
                or (
                    entry.routing_key is not None
                    and topic_matches(self.routing_key, entry.routing_key)
                )
            )
        )

    def _when(self, at: datetime | None) -> bool:
        if self.since is None and self.until is None:
            return True
        if at is None:
            return False
        return (self.since is None or at >= self.since) and (self.until is None or at < self.until)


@dataclass(frozen=True, slots=True)
class Group:
    """Dead letters of one fingerprint: how many, when, and the latest as a sample."""

    fingerprint: Fingerprint
    count: int
    first_seen: datetime | None  # the earliest x-semel-dead-lettered-at of the group
    last_seen: datetime | None
    sample_error: str | None
    sample_key: str | None

    @property
    def group_id(self) -> str:
        return self.fingerprint.group_id

    def as_json(self) -> dict[str, Any]:
        return {
            "group": self.group_id,
            "count": self.count,
            "reason": self.fingerprint.reason,
            "error_type": self.fingerprint.error_type,
            "error_frame": self.fingerprint.frame,
            "first_seen": self.first_seen and self.first_seen.isoformat(),
            "last_seen": self.last_seen and self.last_seen.isoformat(),
            "sample_error": self.sample_error,
            "sample_key": self.sample_key,
        }


@dataclass(slots=True)
class _Gathering:
    sample: DlqEntry  # the latest of its group: what it fails with now
    count: int = 0
    first_seen: datetime | None = None
    last_seen: datetime | None = None

    def add(self, entry: DlqEntry) -> None:
        self.count += 1
        at = entry.dead_lettered_at
        if at is None:
            return
        self.first_seen = at if self.first_seen is None else min(self.first_seen, at)
        if self.last_seen is None or at > self.last_seen:
            # Not the first in the DLQ: every listing hands the letters back, and
            # that reorders them, so the sample would change from run to run.
            self.last_seen, self.sample = at, entry


def groups(entries: Iterable[DlqEntry]) -> list[Group]:
    """The groups of ``entries``, the largest first (then the latest, then by id)."""
    gathered: dict[Fingerprint, _Gathering] = {}
    for entry in entries:
        mark = fingerprint(entry)
        gathering = gathered.get(mark)
        if gathering is None:
            gathering = gathered[mark] = _Gathering(entry)
        gathering.add(entry)
    found = [
        Group(mark, g.count, g.first_seen, g.last_seen, g.sample.error, g.sample.key)
        for mark, g in gathered.items()
    ]
    return sorted(found, key=_rank)


def _rank(group: Group) -> tuple[int, float, str]:
    latest = group.last_seen.timestamp() if group.last_seen is not None else float("-inf")
    return (-group.count, -latest, group.group_id)

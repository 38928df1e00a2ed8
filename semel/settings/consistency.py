"""Settings that are each valid but contradict one another: one line naming them.

Read by :class:`semel.settings.model.Settings` once every field has been parsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from semel.settings.model import Settings

PREFIX = "SEMEL_"
# Transactional mode keeps one connection per handler in its transaction, up to
# this many (semel.stores.postgres.transactional.POOL_MAX): a larger prefetch would have
# deliveries claim their keys and then queue for a connection.
TRANSACTIONAL_CONNECTIONS = 32


def retry_chain(delays: Sequence[float], max_attempts: int) -> float:
    """Seconds a message can wait in the retry tiers, first attempt to last: the
    ``max_attempts - 1`` waits, the last tier repeating (as RetryPolicy.delay does)."""
    return sum(delays[min(attempt, len(delays)) - 1] for attempt in range(1, max_attempts))


def contradiction(settings: Settings) -> str | None:
    """The first pair of settings that contradict each other, as one line; else None."""
    for check in (_retention, _claims, _transactional):
        problem = check(settings)
        if problem:
            return problem
    return None


def _retention(s: Settings) -> str | None:
    # A completed key must outlive every redelivery that can still arrive:
    # the longest path is every retry back to back.
    chain = retry_chain(s.retry_delays, s.max_attempts)
    if s.retention < chain:
        return (
            f"{PREFIX}RETENTION: {s.retention:g}s is shorter than the retries it must "
            f"outlive ({chain:g}s: {s.max_attempts - 1} waits of {PREFIX}RETRY_DELAYS "
            f"for {PREFIX}MAX_ATTEMPTS={s.max_attempts}, the last delay repeating)"
        )
    # A live claim must never be forgotten under its owner, or a new claim
    # could be granted the fence the owner still holds.
    if s.retention < s.lock_ttl:
        return (
            f"{PREFIX}RETENTION: {s.retention:g}s is shorter than "
            f"{PREFIX}LOCK_TTL ({s.lock_ttl:g}s)"
        )
    return None


def _claims(s: Settings) -> str | None:
    # Every attempt claims the key once: an attempt past the claims allowed
    # would be dead-lettered as poison instead of being run.
    if s.max_attempts > s.max_claims:
        return (
            f"{PREFIX}MAX_ATTEMPTS: {s.max_attempts} is above {PREFIX}MAX_CLAIMS "
            f"({s.max_claims}): attempts past the claims would be dead-lettered as poison"
        )
    return None


def _transactional(s: Settings) -> str | None:
    if not s.transactional:
        return None
    if s.store.value != "postgres":
        return (
            f"{PREFIX}TRANSACTIONAL: needs {PREFIX}STORE=postgres "
            f"({PREFIX}STORE is {s.store.value})"
        )
    if s.prefetch > TRANSACTIONAL_CONNECTIONS:
        return (
            f"{PREFIX}PREFETCH: {s.prefetch} is above the {TRANSACTIONAL_CONNECTIONS} "
            f"connections {PREFIX}TRANSACTIONAL=true runs handlers on (one each); "
            f"set {PREFIX}PREFETCH to {TRANSACTIONAL_CONNECTIONS} or less"
        )
    return None

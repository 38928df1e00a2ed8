"""Why a claim was refused, judged from the row a store read back afterwards.

Shared by the SQL backends: their upsert returns nothing when it declines to
write, and the row they then read may already have moved on.
"""

from __future__ import annotations

from semel.stores.base import Claim, Outcome, Record, Status


def written_claim(record: Record) -> Claim:
    """The claim a row the upsert wrote (and returned) stands for.

    RETURNING only yields a row the statement wrote, and it writes either a
    claim (in_progress) or a poisoning (failed).
    """
    return Claim(Outcome.CLAIMED if record.status is Status.IN_PROGRESS else Outcome.POISON, record)


def refused_outcome(record: Record, fingerprint: str, live: bool, leased: bool) -> Outcome | None:
    """The outcome a refused claim reports, or ``None`` when the row is claimable now.

    ``live``: the record is within retention; ``leased``: its lease has not
    ended, both by the store's clock. A fingerprint mismatch wins over every
    stored state, because a reused key is reported as such whatever it holds.
    """
    if not live:
        return None
    if record.fingerprint != fingerprint:
        return Outcome.MISMATCH
    if record.status is Status.COMPLETED:
        return Outcome.DUPLICATE
    if record.status is Status.FAILED:
        return Outcome.FAILED
    return Outcome.IN_PROGRESS if leased else None

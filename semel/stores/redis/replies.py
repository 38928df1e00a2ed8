"""The replies of the Redis store's scripts, decoded into the store contract's values.

The claim and get scripts answer JSON text, decoded in one call (see
record.lua for a record's shape); the complete script one character per key.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import orjson

from semel.stores.base import Claim, ClaimRequest, Completion, Outcome, Record, Status
from semel.stores.codec import from_epoch_ms
from semel.stores.errors import KeyRefused
from semel.stores.redis.errors import foreign

_WRITTEN = ord("1")  # complete.lua's answer for a key it wrote
_REFUSED = ord("R")  # and for a key a foreign value holds
# Looked up per key of a batch; a dict is several times cheaper than Enum(value).
_STATUS = {s.value: s for s in Status}
_OUTCOME = {o.value: o for o in Outcome}


def record(key: str, now: int, answer: Sequence[Any]) -> Record:
    """Build a record from a record_json answer (see record.lua for its shape)."""
    _, pttl, fingerprint, status, fence, claims, lease, result, error, first, updated = answer
    return Record(
        key=key,
        fingerprint=fingerprint,
        status=_STATUS[status],
        fence=fence,
        claims=claims,
        lease_expires_at=from_epoch_ms(lease),
        result=result,
        error=error,
        first_seen=from_epoch_ms(first),
        updated_at=from_epoch_ms(updated),
        # PTTL is -1 when someone removed the expiry by hand: nothing will forget it.
        expires_at=from_epoch_ms(now + pttl) if pttl >= 0 else None,
    )


def decode_record(key: str, reply: bytes) -> Record:
    """get.lua's reply: ``[server_ms, record_json]``."""
    now, answer = orjson.loads(reply)
    return record(key, now, answer)


def decode_claims(
    requests: Sequence[ClaimRequest], reply: bytes, lock_ms: int, live_ms: int
) -> list[Claim | KeyRefused]:
    """The claims one call of claim.lua decided, in order; ``lock_ms`` and ``live_ms``
    (a live record's TTL) as the script was sent them."""
    now, fresh_fence, *answers = orjson.loads(reply)
    claims: list[Claim | KeyRefused] = []
    fresh: Callable[[ClaimRequest], Claim] | None = None
    for request, answer in zip(requests, answers, strict=True):
        if answer == 0:
            fresh = fresh or _fresh(now, fresh_fence, lock_ms, live_ms)
            claims.append(fresh(request))
        elif type(answer) is str:  # the type of a foreign value at the key
            claims.append(KeyRefused(request.key, foreign(answer)))
        else:
            claims.append(Claim(_OUTCOME[answer[0]], record(request.key, now, answer)))
    return claims


@functools.lru_cache(maxsize=64)
def _times(now: int, lock_ms: int, live_ms: int) -> tuple[datetime | None, ...]:
    # Cached: the calls of a Cluster batch, one per hash tag, mostly answer the same
    # millisecond, and three datetimes per call cost more than the call's decoding.
    return from_epoch_ms(now), from_epoch_ms(now + lock_ms), from_epoch_ms(now + live_ms)


def _fresh(now: int, fence: int, lock_ms: int, live_ms: int) -> Callable[[ClaimRequest], Claim]:
    """First claims of absent keys at ``now`` (ms) with ``fence``, as claim.lua wrote them."""
    at, lease, expires = _times(now, lock_ms, live_ms)

    def claim(request: ClaimRequest) -> Claim:
        fresh = Record(
            request.key, request.fingerprint, Status.IN_PROGRESS, fence, 1, lease, None, None,
            at, at, expires,
        )  # fmt: skip
        return Claim(Outcome.CLAIMED, fresh)

    return claim


def decode_completions(completions: Sequence[Completion], reply: bytes) -> list[bool | KeyRefused]:
    """complete.lua's reply: a flag per key, in order: written, fenced out, or refused."""
    if _REFUSED not in reply:
        return [flag == _WRITTEN for flag in reply]
    return [
        KeyRefused(c.key, foreign()) if flag == _REFUSED else flag == _WRITTEN
        for c, flag in zip(completions, reply, strict=True)
    ]

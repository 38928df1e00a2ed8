"""One key's record as a DynamoDB item: its attributes, every conditional write, the claim decision.

DynamoDB has no server clock an expression can read, so every lease and
retention time is taken from the client's UTC clock (``time.time()``) and kept
as an epoch number: lease and bookkeeping times in milliseconds, the TTL
attribute in whole seconds because that is what DynamoDB's TTL sweeper reads.
The sweeper deletes expired items lazily (up to days later), so every
condition and every read also treats an item whose retention has passed as
absent.

A key claimed with no item starts its fence at the same clock in microseconds
since the Unix epoch; over an item past retention, at the larger of that and
the item's fence + 1; a takeover adds one. So a key forgotten (swept, deleted)
and claimed again gets a fence above every one it had, provided the claiming
worker's clock is not behind the clock of the worker that first claimed the
key by more than the time between the two: with no server clock, the limit is
the skew between the workers' clocks.

The client retries a write whose answer was lost (read timeout, closed
connection) although the first attempt may have been applied. The writes below
are built so that such a repeat recognises its own earlier success.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING

from semel.stores.base import POISON_ERROR, Claim, Outcome, Record, Status, StoreConfig
from semel.stores.codec import from_epoch_ms, load_result
from semel.stores.shared.refusal import refused_outcome

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

Item = dict[str, "AttributeValueTypeDef"]

PARTITION_KEY = "pk"
TTL_ATTRIBUTE = "expires_at"

# A key never seen before is claimed by writing its whole first item on the
# condition that none exists: the cheapest conditional write there is, and the
# one almost every message makes.
NEW_CONDITION = "attribute_not_exists(#pk)"
# Any other claim takes the key when it is absent, or in progress with a lapsed
# lease, the same payload, claims left and retention not passed. A record past
# retention fails it on purpose: replacing one restarts `claims` at 1 and takes
# the larger of the clock and the fence + 1, which one UpdateItem cannot choose,
# so that rare case is a second write (see `fresh_item`). Where the item is
# absent, the fence starts from the clock (``:now_us``) as a new key's does.
CLAIM_CONDITION = (
    "attribute_not_exists(#pk) OR (#status = :in_progress AND #fingerprint = :fp"
    " AND #lease_expires_at <= :now_ms AND #claims < :max_claims AND #expires_at > :now_s)"
)
CLAIM_UPDATE = (
    "SET #fingerprint = :fp, #status = :in_progress, #claim_token = :token,"
    " #fence = if_not_exists(#fence, :now_us) + :one,"
    " #claims = if_not_exists(#claims, :zero) + :one,"
    " #lease_expires_at = :lease, #first_seen = if_not_exists(#first_seen, :now_ms),"
    " #updated_at = :now_ms, #expires_at = :live_until"
)
# The rare second writes stay conditional on the exact state they were decided on.
REPLACE_CONDITION = "#fence = :fence AND #expires_at <= :now_s"
POISON_CONDITION = (
    "#fence = :fence AND #status = :in_progress"
    " AND #lease_expires_at <= :now_ms AND #expires_at > :now_s"
)
# Every write after a claim is fenced, and a key past retention belongs to nobody.
OWNER_CONDITION = "#fence = :fence AND #expires_at > :now_s AND #status = :in_progress"
# A lease its worker released is over: a renewal landing late cannot hold the
# key for nobody. A repeat meets the lease its first attempt extended.
HEARTBEAT_CONDITION = OWNER_CONDITION + " AND #lease_expires_at > :now_ms"
# A failed key only, poison included (claims used up, no lease): a completed
# key stays completed, a claim in hand keeps its lease. The last clause is this
# very reset repeated by the client, with no claim in between.
RESET_CONDITION = (
    "attribute_exists(#pk) AND #expires_at > :now_s AND (#status = :failed"
    " OR (#status = :in_progress AND #claims >= :max_claims"
    " AND (attribute_not_exists(#lease_expires_at) OR #lease_expires_at <= :now_ms))"
    " OR (#status = :in_progress AND #claims = :zero AND #lease_expires_at = :now_ms))"
)
FINISH = ", #updated_at = :now_ms, #expires_at = :done_until REMOVE #lease_expires_at"


class Step(Enum):
    """What a refused claim does next when its answer is not an outcome yet."""

    RETRY = "retry"  # the item changed since the write: write again
    REPLACE = "replace"  # past retention: replace it, the fence grows over it
    POISON = "poison"  # lapsed lease and no claims left: mark it failed


@dataclass(frozen=True, slots=True)
class Instant:
    """One reading of the client's clock, in the units the item stores."""

    seconds: float

    @classmethod
    def now(cls) -> Instant:
        return cls(time.time())

    @property
    def ms(self) -> int:
        return math.floor(self.seconds * 1000)

    @property
    def us(self) -> int:
        """Microseconds since the epoch: where a key with no item starts its fence."""
        return math.floor(self.seconds * 1_000_000)

    @property
    def whole_seconds(self) -> int:
        # expires_at holds whole seconds, so `expires_at <= floor(now)` is
        # exactly "retention has passed".
        return math.floor(self.seconds)


@dataclass(frozen=True, slots=True)
class Update:
    """One conditional UpdateItem, less the table and key."""

    expression: str
    condition: str
    names: dict[str, str]
    values: Item


def string(value: str) -> AttributeValueTypeDef:
    return {"S": value}


def number(value: int) -> AttributeValueTypeDef:
    return {"N": str(value)}


def names(*expressions: str) -> dict[str, str]:
    """A placeholder per attribute used: ``status``, ``ttl`` and hundreds more are reserved."""
    return {p: p[1:] for p in sorted({m for e in expressions for m in re.findall(r"#\w+", e)})}


def lease_end(now: Instant, config: StoreConfig) -> int:
    return now.ms + math.ceil(config.lock_ttl * 1000)


def live_until(now: Instant, config: StoreConfig) -> int:
    """The TTL of an in-progress item: never before its lease ends, or a live lease looks absent."""
    return math.ceil(now.seconds + max(config.retention, config.lock_ttl))


# The values an expression may use besides its own; each is computed only when used.
STANDARD_VALUES: dict[str, Callable[[Instant, StoreConfig], AttributeValueTypeDef]] = {
    ":in_progress": lambda now, config: string(Status.IN_PROGRESS),
    ":completed": lambda now, config: string(Status.COMPLETED),
    ":failed": lambda now, config: string(Status.FAILED),
    ":zero": lambda now, config: number(0),
    ":one": lambda now, config: number(1),
    ":now_ms": lambda now, config: number(now.ms),
    ":now_us": lambda now, config: number(now.us),
    ":now_s": lambda now, config: number(now.whole_seconds),
    ":lease": lambda now, config: number(lease_end(now, config)),
    ":max_claims": lambda now, config: number(config.max_claims),
    ":live_until": lambda now, config: number(live_until(now, config)),
    ":done_until": lambda now, config: number(math.ceil(now.seconds + config.retention)),
}


@functools.cache
def placeholders(expression: str, condition: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """The attribute names and the values two expressions use; there are a handful of them."""
    used = sorted(set(re.findall(r":\w+", f"{expression} {condition}")))
    return names(expression, condition), tuple(used)


def update(
    expression: str, condition: str, now: Instant, config: StoreConfig, **extra: str | int
) -> Update:
    """An Update with exactly the values its expressions use (DynamoDB rejects unused ones)."""
    attribute_names, used = placeholders(expression, condition)
    values: Item = {}
    for name in used:
        value = extra.get(name[1:])
        if value is None:
            values[name] = STANDARD_VALUES[name](now, config)
        else:
            values[name] = string(value) if isinstance(value, str) else number(value)
    return Update(expression, condition, dict(attribute_names), values)


def claim_update(fingerprint: str, token: str, now: Instant, config: StoreConfig) -> Update:
    return update(CLAIM_UPDATE, CLAIM_CONDITION, now, config, fp=fingerprint, token=token)


def poison_update(fence: int, now: Instant, config: StoreConfig) -> Update:
    expression = "SET #status = :failed, #error = :error" + FINISH
    return update(expression, POISON_CONDITION, now, config, fence=fence, error=POISON_ERROR)


def complete_update(fence: int, result: str, now: Instant, config: StoreConfig) -> Update:
    # A repeat of this same completion (a retried request) is refused and then
    # recognised by `finished_as`: a shorter condition is cheaper for the server.
    expression = "SET #status = :completed, #result = :result" + FINISH
    return update(expression, OWNER_CONDITION, now, config, fence=fence, result=result)


def fail_update(fence: int, error: str, now: Instant, config: StoreConfig) -> Update:
    expression = "SET #status = :failed, #error = :error" + FINISH
    return update(expression, OWNER_CONDITION, now, config, fence=fence, error=error)


def finished_as(item: Item, fence: int, status: Status, attribute: str, value: str) -> bool:
    """Whether a refused finish met its own earlier success: this fence, this outcome."""
    return (
        fence_of(item) == fence
        and _str(item, "status") == status
        and _str(item, attribute) == value
        and is_live(item, Instant.now())
    )


# A heartbeat (``:lease``) or a release (``:now_ms``): repeats are harmless.
LEASE_UPDATE = "SET #lease_expires_at = {}, #updated_at = :now_ms, #expires_at = :live_until"


def heartbeat_update(fence: int, now: Instant, config: StoreConfig) -> Update:
    return update(LEASE_UPDATE.format(":lease"), HEARTBEAT_CONDITION, now, config, fence=fence)


def release_update(fence: int, now: Instant, config: StoreConfig) -> Update:
    return update(LEASE_UPDATE.format(":now_ms"), OWNER_CONDITION, now, config, fence=fence)


RESET_UPDATE = (
    "SET #status = :in_progress, #claims = :zero, #lease_expires_at = :now_ms,"
    " #updated_at = :now_ms, #expires_at = :live_until{} REMOVE #result, #error"
)


def reset_update(now: Instant, config: StoreConfig, fingerprint: str | None = None) -> Update:
    """The reset; a ``fingerprint`` given replaces the item's (an edited body's).

    A repeat the client sends is the same Update, so RESET_CONDITION's clause
    for a repeated reset holds for it whether or not it sets a fingerprint.
    """
    if fingerprint is None:
        return update(RESET_UPDATE.format(""), RESET_CONDITION, now, config)
    expression = RESET_UPDATE.format(", #fingerprint = :fp")
    return update(expression, RESET_CONDITION, now, config, fp=fingerprint)


def fresh_item(
    pk: str, fingerprint: str, token: str, fence: int, now: Instant, config: StoreConfig
) -> Item:
    """A first claim's item: of a key with no item, or over a record past retention."""
    return {
        PARTITION_KEY: string(pk),
        "fingerprint": string(fingerprint),
        "status": string(Status.IN_PROGRESS),
        "claim_token": string(token),
        "fence": number(fence),
        "claims": number(1),
        "lease_expires_at": number(lease_end(now, config)),
        "first_seen": number(now.ms),
        "updated_at": number(now.ms),
        TTL_ATTRIBUTE: number(live_until(now, config)),
    }


def _int(item: Item, name: str) -> int | None:
    value = item.get(name)
    return None if value is None or "N" not in value else int(value["N"])


def _str(item: Item, name: str) -> str | None:
    value = item.get(name)
    return None if value is None else value.get("S")


def is_live(item: Item, now: Instant) -> bool:
    expires = _int(item, TTL_ATTRIBUTE)
    return expires is None or expires > now.whole_seconds


def fence_of(item: Item) -> int:
    return _int(item, "fence") or 0


def decide(
    key: str, item: Item, fingerprint: str, token: str, now: Instant, max_claims: int
) -> Claim | Step:
    """What a refused claim answers, given the item it collided with, or what to do next."""
    record = to_record(key, item)
    live = is_live(item, now)
    if live and record.status is Status.IN_PROGRESS and _str(item, "claim_token") == token:
        return Claim(Outcome.CLAIMED, record)  # our own write, met by its repeat
    leased = (_int(item, "lease_expires_at") or 0) > now.ms
    outcome = refused_outcome(record, fingerprint, live=live, leased=leased)
    if outcome is not None:
        return Claim(outcome, record)
    if not live:
        return Step.REPLACE
    return Step.POISON if record.claims >= max_claims else Step.RETRY


def to_record(key: str, item: Item) -> Record:
    """The caller's view of an item; ``key`` is the caller's key, without the prefix."""
    expires = _int(item, TTL_ATTRIBUTE)
    return Record(
        key=key,
        fingerprint=_str(item, "fingerprint") or "",
        status=Status(_str(item, "status") or ""),
        fence=fence_of(item),
        claims=_int(item, "claims") or 0,
        lease_expires_at=from_epoch_ms(_int(item, "lease_expires_at")),
        result=load_result(_str(item, "result")),
        error=_str(item, "error"),
        first_seen=from_epoch_ms(_int(item, "first_seen")),
        updated_at=from_epoch_ms(_int(item, "updated_at")),
        expires_at=None if expires is None else datetime.fromtimestamp(expires, tz=UTC),
    )

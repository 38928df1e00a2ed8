"""The Cluster key layout: pinned, one tag per 1/64 of the slots, shares in proportion."""

from __future__ import annotations

from collections import Counter

import pytest
from redis.crc import key_slot

from semel.stores.redis.buckets import BUCKETS, SLOTS, stored_key

PREFIX = b"semel:"


def test_the_layout_is_pinned() -> None:
    # A key stored under another tag is a key never seen: these never change.
    assert stored_key(PREFIX, "order-1") == b"semel:{41}:order-1"
    assert stored_key(PREFIX, "k") == b"semel:{59}:k"
    assert stored_key(b"svc-a:", "k") == b"svc-a:{59}:k"


def test_each_tag_holds_its_own_share_of_the_slots() -> None:
    keys = [f"key-{i}" for i in range(20_000)]
    slots = Counter(key_slot(stored_key(PREFIX, k)) for k in keys)
    assert len(slots) == BUCKETS
    share = SLOTS // BUCKETS
    assert sorted(slot // share for slot in slots) == list(range(BUCKETS))
    # The keys spread evenly over the tags (a hash, not a round robin): within 20 %.
    mean = len(keys) / BUCKETS
    assert all(abs(n - mean) < 0.2 * mean for n in slots.values()), slots


@pytest.mark.parametrize("primaries", [3, 5, 10])
def test_primaries_with_equal_ranges_get_tags_within_one(primaries: int) -> None:
    # As `redis-cli --cluster create` splits the slots: contiguous, equal ranges.
    bounds = [SLOTS * i // primaries for i in range(primaries + 1)]
    tags = {key_slot(stored_key(PREFIX, f"k{i}")) for i in range(5_000)}
    per_node = Counter(
        next(n for n in range(primaries) if bounds[n] <= slot < bounds[n + 1]) for slot in tags
    )
    assert max(per_node.values()) - min(per_node.values()) <= 1, per_node


def test_a_key_with_braces_stays_in_its_bucket() -> None:
    # Only the first {...} is a hash tag: the user's own braces change nothing.
    key = stored_key(PREFIX, "{user}-tag")
    assert key.startswith(b"semel:{")
    assert key.endswith(b"}:{user}-tag")
    tag = key[len(PREFIX) : key.index(b"}") + 1]
    assert key_slot(key) == key_slot(tag) != key_slot(b"{user}")

"""Where the Redis store keeps a key in a Redis Cluster: one of 64 hash tags.

A script call may only take keys of one hash slot. With keys spread over
all 16384 slots, a batch of a few hundred keys is a call per key, and each
call costs the client a packed command, a reply to read and decode, and the
server a script run and its replication: about five times the client's CPU per
key of one call per batch. So a key is stored under one of :data:`BUCKETS`
hash tags, ``<prefix>:{<tag>}:<key>``, the bucket a stable hash of the key:
a batch of 256 keys becomes about 63 calls, whatever its size beyond that
at most 64.

The number weighs batch size against balance. Each tag is chosen so that its
slot falls in its own 1/64 of the slot range, evenly spaced; a cluster whose
primaries own contiguous shares of the slots (``redis-cli --cluster create``
and ``rebalance`` give that) then holds a share of the tags in proportion to
its share of the slots, within one tag: 21 or 22 tags per primary of three,
6 or 7 of ten. Fewer tags would make fewer calls but weigh more unevenly,
and more than 64 primaries would leave some with none. A resharding moves a
tag's keys together, 1/64 of them, as it moves any slot's.

The layout is fixed for good: a key read under another layout is a key
never seen, so the tags and the hash are pinned by a test.
"""

from __future__ import annotations

import zlib
from binascii import crc_hqx
from collections.abc import Sequence

BUCKETS = 64
SLOTS = 16384  # Redis Cluster's hash slots


def _tag(bucket: int) -> bytes:
    """The smallest decimal number whose slot lies in ``bucket``'s share of the slots."""
    share = SLOTS // BUCKETS
    n = 0
    # A hash tag's slot is CRC16 (XMODEM, as crc_hqx from 0) of the tag, mod SLOTS.
    while crc_hqx(b"%d" % n, 0) % SLOTS // share != bucket:
        n += 1
    return b"%d" % n


_TAGS = tuple(b"{%s}:" % _tag(b) for b in range(BUCKETS))


def stored_key(prefix: bytes, key: str) -> bytes:
    """``key`` as a Redis Cluster holds it; ``prefix`` ends in the separator (``semel:``)."""
    raw = key.encode()
    return prefix + _TAGS[zlib.crc32(raw) % BUCKETS] + raw


def layout(prefix: bytes, keys: Sequence[str]) -> tuple[list[bytes], list[list[int]]]:
    """``keys`` as stored (:func:`stored_key`), and their positions grouped by tag,
    each group in one hash slot; the hash is taken once per key for both."""
    stored: list[bytes] = []
    parts: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        raw = key.encode()
        bucket = zlib.crc32(raw) % BUCKETS
        stored.append(prefix + _TAGS[bucket] + raw)
        parts.setdefault(bucket, []).append(i)
    return stored, list(parts.values())

"""What the tests may assert of a fence: the clock for a key with no record, + 1 per takeover.

A key claimed with no record (never seen, or forgotten) starts at its store's
clock in microseconds since the Unix epoch: the server's (PostgreSQL, Redis)
or this host's (SQLite, DynamoDB's client), all on this machine in the tests.
``SKEW`` allows for a server whose clock is not quite this process's.
"""

from __future__ import annotations

import time

SKEW = 1_000_000  # µs


def clock_us() -> int:
    """This host's clock in microseconds since the Unix epoch."""
    return time.time_ns() // 1_000


def started_fresh(fence: int, since: int) -> bool:
    """Whether ``fence`` was started from the clock by a claim made after ``since`` (µs)."""
    return since - SKEW <= fence <= clock_us() + SKEW

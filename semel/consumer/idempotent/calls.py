"""What a running idempotent call, and a duplicate's response hook, are told."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Call:
    """The call running now: :func:`current_call` inside the decorated function."""

    key: str  # the key as the caller gave it
    scope: str
    fence: int  # grows with every claim of the key; hand it to fenced downstream writes
    attempt: int  # claims of the key since it last completed, this one included (1-based)


@dataclass(frozen=True, slots=True)
class Duplicate:
    """What ``on_duplicate`` is told of the call that completed the key."""

    key: str
    scope: str
    fence: int  # the fence of the run whose result this is
    completed_at: datetime | None
    expires_at: datetime | None  # when the store forgets the key
    cached: bool  # answered from the in-process cache: the store was not asked


CURRENT_CALL: ContextVar[Call] = ContextVar("semel_idempotent_call")


def current_call() -> Call:
    """The idempotent call running in this context; ``LookupError`` outside one."""
    try:
        return CURRENT_CALL.get()
    except LookupError:
        raise LookupError("current_call() is only set inside an idempotent function") from None

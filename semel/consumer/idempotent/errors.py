"""What an idempotent call raises instead of running the function, under
:class:`semel.stores.errors.SemelError`::

    SemelError
     ├── KeyInProgress       another call holds the key ("raise", or "wait" past wait_timeout)
     │    └── RetryLater     another call holds the key; ask again in retry_after seconds
     ├── PayloadMismatch     the key was used with other arguments
     ├── KeyFailed           the key failed for good (PermanentError, or poison)
     └── ResultNotStored     the function returned what the store cannot keep; key released

Raised as they are, from elsewhere: :class:`semel.consumer.errors.LeaseLost`
(the key was taken over while the function ran), :class:`semel.consumer.errors.HandlerTimeout`
(it ran past ``time_limit``) and :class:`semel.stores.errors.StoreError`
(the store could not be reached or refused: the function did not run, or its
lease could not be kept).
"""

from __future__ import annotations

from semel.stores.errors import SemelError


class KeyInProgress(SemelError):
    """Another call holds the key: its lease runs ``retry_after`` seconds more."""

    def __init__(self, key: str, retry_after: float) -> None:
        super().__init__(f"key {key!r} is in progress in another call")
        self.key = key
        self.retry_after = retry_after


class RetryLater(KeyInProgress):
    """Another call holds the key (``in_progress="retry_later"``): come back in ``retry_after``."""


class PayloadMismatch(SemelError):
    """The key was used before with other arguments (another fingerprint); nothing ran."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} was used with other arguments")
        self.key = key


class KeyFailed(SemelError):
    """The key failed for good (a PermanentError, or poison); ``error`` is the stored one."""

    def __init__(self, key: str, error: str | None) -> None:
        super().__init__(f"key {key!r} failed: {error}")
        self.key = key
        self.error = error


class ResultNotStored(SemelError):
    """The function ran, but its result cannot be stored (no JSON form, too large);
    the key was released, so the next call runs the function again."""

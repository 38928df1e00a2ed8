"""Errors a store raises.

StoreError
 ├── StoreUnavailable   the backend cannot be reached or did not answer in time
 └── ResultTooLarge     the handler's result does not fit the backend
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every store error."""


class StoreUnavailable(StoreError):
    """The backend cannot be reached; the cause is attached as ``__cause__``.

    The consumer treats it as "try the delivery again later", never as a bad message.
    """

    def __init__(self, backend: str, detail: str) -> None:
        super().__init__(f"{backend} store unavailable: {detail}")
        self.backend = backend


class ResultTooLarge(StoreError):
    """The result cannot be stored without truncation; nothing was written."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"result of {size} bytes exceeds the store's limit of {limit} bytes")
        self.size = size
        self.limit = limit

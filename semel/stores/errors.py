"""The root of semel's error tree, and the errors a store raises.

The root lives here because ``semel.stores`` imports nothing of the consumer; the
consumer's own errors extend it in :mod:`semel.consumer.errors`::

    SemelError                  exit code 1 unless a class says otherwise
     └── StoreError
          ├── StoreUnavailable      the backend cannot be reached or did not answer in time
          ├── StoreMisconfigured    exit 2: reachable, not set up for semel (run `semel migrate`)
          ├── KeyRefused            this one key cannot be held (a foreign value in its place)
          ├── ResultTooLarge        the handler's result does not fit the backend
          └── FencedOut             the claim was taken over before the unit of work committed
"""

from __future__ import annotations

from typing import ClassVar

EXIT_FAILURE = 1  # anything worth a restart by the supervisor
EXIT_USAGE = 2  # bad usage or configuration: the operator's to fix
# A plain handler's thread could have outlived its lease: the process ends so the
# thread ends with it, before another worker may take the key over.
EXIT_LEASE_LOST = 3


class SemelError(Exception):
    """Base of every error semel raises on purpose; ``exit_code`` is the process's."""

    exit_code: ClassVar[int] = EXIT_FAILURE


class StoreError(SemelError):
    """Base of every store error."""


class StoreUnavailable(StoreError):
    """The backend cannot be reached; the cause is attached as ``__cause__``.

    The consumer treats it as "try the delivery again later", never as a bad message.
    """

    def __init__(self, backend: str, detail: str) -> None:
        super().__init__(f"{backend} store unavailable: {detail}")
        self.backend = backend


class StoreMisconfigured(StoreError):
    """The store answers but is not set up for semel (a table missing, say)."""

    exit_code = EXIT_USAGE


class KeyRefused(StoreError):
    """The store cannot hold this one key: a value of another kind sits in its place,
    or its item would pass the backend's limit. Nothing was written for it; the
    other keys of its batch are decided as usual."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"key {key!r} refused by the store: {detail}")
        self.key = key


class ResultTooLarge(StoreError):
    """The result cannot be stored without truncation; nothing was written."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"result of {size} bytes exceeds the store's limit of {limit} bytes")
        self.size = size
        self.limit = limit


class FencedOut(StoreError):
    """The key was claimed again before the unit of work completed it; nothing was committed."""

    def __init__(self, key: str, fence: int) -> None:
        super().__init__(f"claim of {key!r} under fence {fence} was taken over before commit")

"""Idempotency stores: the contract (``semel.stores.base``) and one module per backend.

Backends are imported by the container only when selected, so a Redis user
never needs psycopg or boto3 installed. Each backend module exposes
``async def open_store(*, ..., config: StoreConfig) -> Store``, whose other
keyword arguments are plain values (a path, a DSN, a URL, a table name, how
many connections to pool): ``semel.stores`` never reads the settings itself.
"""

from semel.stores.base import JSON, Claim, Outcome, Record, Status, Store, StoreConfig
from semel.stores.errors import (
    FencedOut,
    ResultTooLarge,
    SemelError,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
)

__all__ = [
    "JSON",
    "Claim",
    "FencedOut",
    "Outcome",
    "Record",
    "ResultTooLarge",
    "SemelError",
    "Status",
    "Store",
    "StoreConfig",
    "StoreError",
    "StoreMisconfigured",
    "StoreUnavailable",
]

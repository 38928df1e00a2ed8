"""Idempotency stores: the contract (``stores.base``) and one module per backend.

Backends are imported by the container only when selected, so a Redis user
never needs psycopg or boto3 installed. Each backend module exposes
``async def open_store(settings) -> Store``.
"""

from stores.base import JSON, Claim, Outcome, Record, Status, Store, StoreConfig
from stores.errors import ResultTooLarge, StoreError, StoreUnavailable

__all__ = [
    "JSON",
    "Claim",
    "Outcome",
    "Record",
    "ResultTooLarge",
    "Status",
    "Store",
    "StoreConfig",
    "StoreError",
    "StoreUnavailable",
]

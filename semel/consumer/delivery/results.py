"""A handler's result as its key keeps it: never the reason a handler that
succeeded runs again or is dead-lettered.

Common Python values are stored in their JSON form (:mod:`semel.stores.codec`). A
result the store still cannot keep (no JSON form, past the backend's size
limit) completes the key with ``null`` instead, said once at warning: its
effects have happened, and running the handler again would return the same.
"""

from __future__ import annotations

from typing import Any

import orjson
import structlog

from semel.consumer.delivery.decide import describe
from semel.stores.base import Store
from semel.stores.errors import ResultTooLarge

log = structlog.get_logger("semel.pipeline")

NOT_STORED = orjson.Fragment(b"null")


def storable(store: Store, key: str, result: Any) -> orjson.Fragment:
    """``result`` encoded as ``store`` writes it, or ``null`` if it cannot be kept;
    a fragment, so each write of it costs a copy, not an encoding."""
    try:
        return orjson.Fragment(store.encode_result(result))
    except (orjson.JSONEncodeError, ResultTooLarge) as exc:
        log.warning("result not stored, the key completed with null", key=key, error=describe(exc))
        return NOT_STORED

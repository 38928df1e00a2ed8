"""How results and timestamps are written, shared by the backends."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson

from stores.base import JSON


def load_result(data: bytes | str | None) -> JSON:
    return None if data is None else orjson.loads(data)


def from_epoch_ms(ms: int | float | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)

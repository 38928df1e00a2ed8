"""How results and timestamps are written, shared by the backends.

A handler's result is stored as JSON. Values JSON has no word for are written
in their usual JSON form rather than refused: a pydantic model as its
``model_dump(mode="json")``, a dataclass as an object of its fields, a
``Decimal`` as its exact decimal string, ``datetime``/``date``/``time`` in ISO
8601, a ``UUID`` as its canonical string, an ``Enum`` as its value, a set or
frozenset as a list (sorted when its items sort), a tuple as a list, and
dictionary keys that are numbers, UUIDs or dates as strings. Anything else
raises ``orjson.JSONEncodeError``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS


def _json_form(value: Any) -> Any:
    """What orjson writes for a value it does not know; raises TypeError otherwise."""
    model_dump = getattr(type(value), "model_dump", None)  # pydantic 2 models
    if callable(model_dump):
        return value.model_dump(mode="json")
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, set | frozenset):
        try:
            return sorted(value)
        except TypeError:  # items of kinds that do not compare
            return list(value)
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def dump_result(result: Any) -> bytes:
    """``result`` as stored JSON; raises ``orjson.JSONEncodeError`` for what has no JSON form."""
    return orjson.dumps(result, default=_json_form, option=_OPTIONS)


def load_result(data: bytes | str | None) -> Any:
    return None if data is None else orjson.loads(data)


def from_epoch_ms(ms: int | float | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)

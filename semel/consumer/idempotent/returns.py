"""A function's result as its key keeps it, and as a duplicate call gets it back.

Stored as the store stores any result: JSON, common Python values in their
usual JSON form (:mod:`semel.stores.codec`). A duplicate gets that JSON
validated as the function's return annotation (pydantic's ``TypeAdapter``,
lax), so a pydantic model, a dataclass, a ``Decimal``, a ``datetime``... come
back as their type; with no annotation (or ``Any``) it gets the JSON itself.

Unlike the worker, which completes a key with ``null`` rather than run a
handler again for what it returned, a call whose result cannot be stored
raises :class:`ResultNotStored` with the key released: its caller is there to
hear it, and a duplicate answered ``null`` would be a wrong answer.
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Callable
from typing import Any

import orjson
from pydantic import TypeAdapter

from semel.consumer.delivery.decide import describe
from semel.consumer.idempotent.errors import ResultNotStored
from semel.stores.base import Store
from semel.stores.errors import ResultTooLarge

_UNREAD = object()  # the annotation not resolved yet (a forward reference, say)


class Returns:
    """How one function's results are stored and rebuilt."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self._function = function
        self._adapter: Any = _UNREAD
        with contextlib.suppress(NameError):  # a name defined later: resolved on first use
            self._adapter = self._read()

    def _read(self) -> TypeAdapter[Any] | None:
        annotation = typing.get_type_hints(self._function).get("return", Any)
        return None if annotation is Any else TypeAdapter(annotation)

    def encode(self, store: Store, key: str, result: Any) -> bytes:
        """``result`` as ``store`` writes it; :class:`ResultNotStored` if it cannot."""
        try:
            return store.encode_result(result)
        except (orjson.JSONEncodeError, ResultTooLarge) as exc:
            raise ResultNotStored(f"result of key {key!r} not stored: {describe(exc)}") from exc

    def rebuild(self, stored: Any) -> Any:
        """The stored JSON as the function's return annotation says."""
        if self._adapter is _UNREAD:
            self._adapter = self._read()
        adapter: TypeAdapter[Any] | None = self._adapter
        return stored if adapter is None else adapter.validate_python(stored)

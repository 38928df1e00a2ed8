"""A call's arguments as the decorator reads them: the key, the fingerprint of
the payload, and the arguments the function is called with (its fence added).

Arguments are bound to the function's signature with defaults applied, so
``charge("o-1", 5)`` and ``charge(order_id="o-1", amount=5)`` are one payload.
A dotted path (``"order.id"``) reads an argument, then a key of a mapping or
an attribute of an object at each step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from semel.consumer.delivery.message import fingerprint
from semel.stores.codec import dump_result

FENCE = "fence"  # the keyword parameter a fenced function receives its claim's fence in

KeyOf = str | Callable[..., str]
_FENCEABLE = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@dataclass(frozen=True, slots=True)
class Bound:
    """One call: its key, its payload's fingerprint, and the arguments by name."""

    key: str
    fingerprint: str
    values: dict[str, Any]  # every parameter but the fence, defaults applied


class Arguments:
    """What the decorator reads of one function's calls; checked when it is decorated."""

    def __init__(self, function: Callable[..., Any], key: KeyOf, fields: Sequence[str] | None):
        self._full = inspect.signature(function)
        params = self._full.parameters
        self.fenced = FENCE in params and params[FENCE].kind in _FENCEABLE
        # The signature callers see: the fence is the decorator's to pass.
        self.signature = self._full.replace(
            parameters=[p for p in params.values() if not (self.fenced and p.name == FENCE)]
        )
        self._key = key
        self._fields = None if fields is None else tuple(fields)
        for path in ([key] if isinstance(key, str) else []) + list(self._fields or ()):
            self._check(path)

    def _check(self, path: str) -> None:
        head = path.split(".", 1)[0]
        params = self.signature.parameters
        any_keyword = any(p.kind is p.VAR_KEYWORD for p in params.values())
        if not head or (head not in params and not any_keyword):
            raise TypeError(f"{path!r} names no argument of {self._full}")

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
        """Raises ``TypeError`` as the function would for arguments that do not fit it."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        if isinstance(self._key, str):
            raw = self._resolve(values, self._key)
        else:
            raw = self._key(*args, **kwargs)
        if isinstance(raw, bool) or not isinstance(raw, str | int) or raw == "":
            raise ValueError(f"the idempotency key must be a non-empty str or an int: {raw!r}")
        if self._fields is None:
            payload = values
        else:
            payload = {path: self._resolve(values, path) for path in self._fields}
        return Bound(str(raw), _digest(payload), values)

    def _resolve(self, values: Mapping[str, Any], path: str) -> Any:
        head, *rest = path.split(".")
        try:
            if head in values:
                value = values[head]
            else:  # an argument gathered by **kwargs (checked to exist when decorated)
                gathered = next(
                    values[p.name]
                    for p in self.signature.parameters.values()
                    if p.kind is p.VAR_KEYWORD
                )
                value = gathered[head]
            for part in rest:
                value = value[part] if isinstance(value, Mapping) else getattr(value, part)
        except (KeyError, AttributeError) as exc:
            raise ValueError(f"{path!r} is not in the call's arguments ({exc!r})") from None
        return value

    def call_with(self, values: Mapping[str, Any], fence: int) -> tuple[list[Any], dict[str, Any]]:
        """The positional and keyword arguments the function is called with; ``fence``
        among them when it takes one."""
        if self.fenced:
            values = {**values, FENCE: fence}
        # By name where a name may be given: a positional-or-keyword fence
        # shifts the positions of the parameters after it.
        spread = any(p.kind is p.VAR_POSITIONAL for p in self._full.parameters.values())
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for name, param in self._full.parameters.items():
            if name not in values:
                continue
            value = values[name]
            if param.kind is param.VAR_POSITIONAL:
                args.extend(value)
            elif param.kind is param.VAR_KEYWORD:
                kwargs.update(value)
            elif param.kind is param.POSITIONAL_ONLY or (
                spread and param.kind is param.POSITIONAL_OR_KEYWORD
            ):
                args.append(value)
            else:
                kwargs[name] = value
        return args, kwargs


def _digest(payload: Mapping[str, Any]) -> str:
    """The payload's fingerprint: its stored JSON form (models, dataclasses, Decimal... as
    :mod:`semel.stores.codec` writes them), hashed as the worker hashes a body."""
    try:
        data = dump_result(payload)
    except orjson.JSONEncodeError as exc:
        raise TypeError(
            f"an argument has no JSON form for the payload fingerprint ({exc}); "
            "name the arguments that make up the payload with fields=[...]"
        ) from None
    return fingerprint(orjson.loads(data))

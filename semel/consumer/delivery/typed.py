"""Typed bodies: a handler that declares its body as a pydantic model or a dataclass.

A parameter annotated with a ``pydantic.BaseModel`` subclass or a dataclass
receives the body validated into it (``Model.model_validate(body)``), unless
it has a default; a
parameter annotated with :class:`~semel.consumer.delivery.handler.Context` (or a
subclass) receives the context, wherever it stands::

    async def charge(order: OrderPaid, ctx: Context) -> Receipt: ...
    def ship(order: OrderPaid) -> None: ...

Annotations are resolved once, when the handler is loaded (``from __future__
import annotations`` modules too). :func:`bind` turns such a handler into an
ordinary one, called with a context like any other, so the timing, thread
and transactional wrappers around it need not know. The pipeline validates
the body before it claims the key (:meth:`BodyType.validate`): validation is
deterministic, so a body that fails it is dead-lettered as ``invalid-body``
like a malformed one, and the handler never runs.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson
import pydantic

from semel.consumer.delivery.handler import Context, Handler, is_async
from semel.consumer.delivery.message import Parsed
from semel.consumer.errors import HandlerLoadError, InvalidBody

# x-semel-validation-errors: a JSON list of the first errors that fit, each
# {loc, type, msg}; never pydantic's ``input`` (the body's values) or ``ctx``.
VALIDATION_ERRORS_LIMIT = 512  # bytes
MAX_ERRORS = 10
_MSG_CHARS = 160
_LOC_PART_CHARS = 40
_LOC_PARTS = 8

Slot = Literal["body", "context"]


@dataclass(frozen=True, slots=True)
class BodyType:
    """The type a handler's body is validated into."""

    name: str
    adapter: pydantic.TypeAdapter[Any]

    def validate(self, parsed: Parsed) -> Parsed:
        """``parsed`` with its body validated, or :class:`InvalidBody`."""
        try:
            value = self.adapter.validate_python(parsed.body)
        except pydantic.ValidationError as exc:
            errors = exc.errors(include_url=False, include_context=False, include_input=False)
            raise InvalidBody(self.summary(len(errors)), bounded_errors(errors)) from None
        except Exception as exc:  # a validator's own bug: as deterministic as a refusal
            error = {"loc": [], "type": type(exc).__name__, "msg": "raised by a validator"}
            raise InvalidBody(self.summary(1), bounded_errors([error])) from None
        return replace(parsed, validated=value)

    def summary(self, count: int) -> str:
        """The dead letter's ``x-semel-error`` and the log line's ``error``: the body's
        values never appear in it, nor the places they sit (a key may be a value)."""
        errors = "1 validation error" if count == 1 else f"{count} validation errors"
        return f"body is not a valid {self.name}: {errors} (see x-semel-validation-errors)"


def bounded_errors(errors: Sequence[Mapping[str, Any]]) -> str:
    """Pydantic's errors as ``x-semel-validation-errors``: a JSON list of the first
    ones (at most ``MAX_ERRORS``) that fit in ``VALIDATION_ERRORS_LIMIT`` bytes,
    each cut to its ``loc``, ``type`` and ``msg``; always valid JSON."""
    kept: list[bytes] = []
    size = 2  # the brackets
    for error in errors[:MAX_ERRORS]:
        item = orjson.dumps(_cut(error))
        if size + len(item) + len(kept) > VALIDATION_ERRORS_LIMIT:  # len(kept): the commas
            if not kept:  # the first alone is too long: its type at least
                kept.append(orjson.dumps({"type": _cut(error)["type"]}))
            break
        kept.append(item)
        size += len(item)
    return (b"[" + b",".join(kept) + b"]").decode()


def _cut(error: Mapping[str, Any]) -> dict[str, Any]:
    loc = [
        part if isinstance(part, int) else str(part)[:_LOC_PART_CHARS]
        for part in tuple(error.get("loc", ()))[:_LOC_PARTS]
    ]
    return {
        "loc": loc,
        "type": str(error.get("type", ""))[:_LOC_PART_CHARS],
        "msg": str(error.get("msg", ""))[:_MSG_CHARS],
    }


@dataclass(frozen=True, slots=True)
class Shape:
    """What a handler's parameters ask for: the body type, and where each argument goes."""

    body: BodyType | None
    positional: tuple[Slot, ...] = ()
    keywords: tuple[tuple[str, Slot], ...] = ()


def is_body_type(hint: Any) -> bool:
    """Whether ``hint`` is a type a body is validated into."""
    if not isinstance(hint, type) or issubclass(hint, Context):  # a Context is a dataclass too
        return False
    return issubclass(hint, pydantic.BaseModel) or dataclasses.is_dataclass(hint)


def _is_context(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Context)


def shape_of(handler: Callable[..., Any]) -> Shape:
    """Read ``handler``'s parameters; :class:`HandlerLoadError` if they cannot be served."""
    name = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    try:
        parameters = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: called with the context
        return Shape(None)
    hints = _hints(handler, name, parameters)
    # One with a default is an option of the handler's own (a settings model, say):
    # a body is always there.
    bodies = [
        p
        for p in parameters
        if p.default is inspect.Parameter.empty and is_body_type(hints.get(p.name))
    ]
    if not bodies:
        return Shape(None)  # a plain handler: called with the context, as it always was
    if len(bodies) > 1:
        raise HandlerLoadError(f"SEMEL_HANDLER: {name} has more than one body parameter")
    contexts = [p for p in parameters if _is_context(hints.get(p.name))]
    if len(contexts) > 1:
        raise HandlerLoadError(f"SEMEL_HANDLER: {name} has more than one Context parameter")
    slots: dict[str, Slot] = {p.name: "context" for p in contexts}
    slots[bodies[0].name] = "body"
    positional, keywords = _plan(name, parameters, slots)
    body_type = hints[bodies[0].name]
    body = BodyType(body_type.__qualname__, pydantic.TypeAdapter(body_type))
    return Shape(body, positional, keywords)


_BY_POSITION = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _plan(
    name: str, parameters: list[inspect.Parameter], slots: Mapping[str, Slot]
) -> tuple[tuple[Slot, ...], tuple[tuple[str, Slot], ...]]:
    """Which arguments go by position (the leading parameters), which by name."""
    positional: list[Slot] = []
    keywords: list[tuple[str, Slot]] = []
    leading = True
    for parameter in parameters:
        slot = slots.get(parameter.name)
        if slot is None:
            leading = False
            if parameter.default is inspect.Parameter.empty and parameter.kind not in _VARIADIC:
                raise HandlerLoadError(
                    f"SEMEL_HANDLER: {name}'s parameter {parameter.name!r} is neither "
                    "the body nor a Context and has no default"
                )
        elif leading and parameter.kind in _BY_POSITION:
            positional.append(slot)
        elif parameter.kind in _BY_NAME:
            leading = False
            keywords.append((parameter.name, slot))
        else:
            raise HandlerLoadError(
                f"SEMEL_HANDLER: {name}'s parameter {parameter.name!r} cannot be passed"
            )
    return tuple(positional), tuple(keywords)


def _hints(
    handler: Callable[..., Any], name: str, parameters: list[inspect.Parameter]
) -> dict[str, Any]:
    """The parameters' annotations, resolved; unresolvable ones that name a Context
    (imported only under ``TYPE_CHECKING``, as linters suggest) are left out."""
    target: Any = handler
    while isinstance(target, functools.partial):
        target = target.func
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        target = getattr(type(target), "__call__", target)  # noqa: B004 - a callable object
    try:
        return typing.get_type_hints(target)
    except Exception as exc:  # NameError mostly: whatever it is, say it in one line
        unresolved = [
            p.name for p in parameters
            if p.annotation is not inspect.Parameter.empty and not _names_context(p.annotation)
        ]  # fmt: skip
        if unresolved:
            raise HandlerLoadError(
                f"SEMEL_HANDLER: cannot resolve the annotations of {name}: {exc} "
                "(import what they name at run time, not under TYPE_CHECKING)"
            ) from None
        return {}


def _names_context(annotation: Any) -> bool:
    """Whether an annotation that could not be resolved names a Context class."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return text.rsplit(".", 1)[-1].endswith("Context")


class TypedHandler:
    """A handler with a typed body, called with a :class:`Context` like any other."""

    def __init__(self, handler: Callable[..., Any], shape: Shape) -> None:
        assert shape.body is not None
        self.__wrapped__ = handler  # the user's function, for introspection
        self.body: BodyType = shape.body
        self._handler = handler
        self._positional = shape.positional
        self._keywords = shape.keywords

    def _arguments(self, context: Context) -> tuple[list[Any], dict[str, Any]]:
        values = {"body": context.validated, "context": context}
        args = [values[slot] for slot in self._positional]
        return args, {name: values[slot] for name, slot in self._keywords}

    def __call__(self, context: Context) -> Any:
        args, kwargs = self._arguments(context)
        return self._handler(*args, **kwargs)


class AsyncTypedHandler(TypedHandler):
    """The same, for an ``async def`` handler (so it is still awaited on the loop)."""

    async def __call__(self, context: Context) -> Any:
        args, kwargs = self._arguments(context)
        return await self._handler(*args, **kwargs)


def bind(handler: Callable[..., Any]) -> Handler:
    """``handler`` as the pipeline calls it: unchanged if it takes a context,
    else a :class:`TypedHandler` that passes it its validated body."""
    shape = shape_of(handler)
    if shape.body is None:
        plain: Handler = handler
        return plain
    return AsyncTypedHandler(handler, shape) if is_async(handler) else TypedHandler(handler, shape)


def body_of(handler: Handler) -> BodyType | None:
    """The body type of a handler :func:`bind` typed, through the wrappers around it
    (each sets ``__wrapped__``, as ``functools.wraps`` does)."""
    found = inspect.unwrap(handler, stop=lambda inner: isinstance(inner, TypedHandler))
    return found.body if isinstance(found, TypedHandler) else None

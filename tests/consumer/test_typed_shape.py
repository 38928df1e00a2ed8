"""The pure parts of typed bodies: reading a handler's parameters, validating a
body, and bounding the errors that go into ``x-semel-validation-errors``."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from semel.consumer import Context
from semel.consumer.broker.copies import dead_letter_copy
from semel.consumer.delivery.decide import decide_bad_message
from semel.consumer.delivery.facts import Facts, Origin
from semel.consumer.delivery.message import Parsed
from semel.consumer.delivery.typed import (
    MAX_ERRORS,
    VALIDATION_ERRORS_LIMIT,
    AsyncTypedHandler,
    TypedHandler,
    bind,
    body_of,
    bounded_errors,
    shape_of,
)
from semel.consumer.errors import BadMessage, HandlerLoadError, InvalidBody
from semel.consumer.names import H_VALIDATION_ERRORS, Reason
from semel.consumer.ops.metrics import Metrics, timed
from tests.consumer import typed_handlers
from tests.consumer.handlers import blocking, scripted
from tests.consumer.typed_handlers import OrderPaid, Parcel

pytestmark = pytest.mark.timeout(10)


DEFAULT_ORDER = OrderPaid(order_id="x", amount=1)


def context(validated: Any = None) -> Context:
    return Context("k", {}, {}, "rk", None, 1, 7, validated=validated)


def test_postponed_annotations_are_resolved_when_the_handler_loads() -> None:
    shape = shape_of(typed_handlers.charge)
    assert shape.body is not None
    assert shape.body.name == "OrderPaid"
    assert (shape.positional, shape.keywords) == (("body", "context"), ())
    assert shape_of(typed_handlers.pack).positional == ("context", "body")


def test_plain_handlers_are_returned_as_they_are() -> None:
    def configured(ctx: Context, options: OrderPaid = DEFAULT_ORDER) -> None:
        """A model with a default is the handler's own option, never the body."""

    for handler in (scripted, blocking, typed_handlers.plain_later, print, configured):
        assert bind(handler) is handler


def test_a_body_only_handler_and_a_keyword_only_context() -> None:
    def body_only(order: OrderPaid) -> str:
        return order.order_id

    async def keyword(order: OrderPaid, *, ctx: Context, retries: int = 2) -> int:
        return ctx.fence

    assert bind(body_only)(context(OrderPaid(order_id="o", amount=1))) == "o"
    bound = bind(keyword)
    assert isinstance(bound, AsyncTypedHandler)
    assert shape_of(keyword).keywords == (("ctx", "context"),)


def test_callable_objects_and_partials() -> None:
    class Charger:
        def __call__(self, order: OrderPaid, ctx: Context) -> tuple[str, int]:
            return order.order_id, ctx.fence

    def charge(order: OrderPaid, ctx: Context, fee: int) -> int:
        return order.amount + fee

    order = OrderPaid(order_id="o", amount=3)
    assert bind(Charger())(context(order)) == ("o", 7)
    assert bind(functools.partial(charge, fee=2))(context(order)) == 5


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("def h(a: OrderPaid, b: Parcel): ...", "more than one body"),
        ("def h(a: OrderPaid, b: Context, c: Context): ...", "more than one Context"),
        ("def h(a: OrderPaid, extra: int): ...", "'extra' is neither the body nor a Context"),
        ("def h(ctx: Context, /, x: int = 1, *, a: OrderPaid): ...", None),
        ("def h(x: int = 1, a: OrderPaid = ..., /, *, b: Parcel): ...", None),
        ("def h(x: int = 1, /, *args: Any, a: OrderPaid): ...", None),
        ("def h(*orders: OrderPaid): ...", "'orders' cannot be passed"),
        ("def h(a: 'Missing', ctx: Context): ...", "cannot resolve the annotations of h"),
    ],
)
def test_handlers_whose_parameters_cannot_be_served_are_refused(
    source: str, error: str | None
) -> None:
    namespace: dict[str, Any] = {"OrderPaid": OrderPaid, "Parcel": Parcel, "Context": Context}
    namespace["Any"] = Any
    exec(source, namespace)  # noqa: S102 - a handler signature under test
    if error is None:
        assert shape_of(namespace["h"]).keywords in ((("a", "body"),), (("b", "body"),))
        return
    with pytest.raises(HandlerLoadError, match=error):
        shape_of(namespace["h"])


def test_the_body_type_is_found_through_the_wrappers_around_it() -> None:
    bound = bind(typed_handlers.ship)
    assert isinstance(bound, TypedHandler)
    assert not isinstance(bound, AsyncTypedHandler)
    metered = timed(bound, Metrics())
    assert body_of(metered) is bound.body
    assert body_of(timed(scripted, Metrics())) is None


def test_a_valid_body_is_validated_into_the_model() -> None:
    body = shape_of(typed_handlers.charge).body
    assert body is not None
    parsed = body.validate(Parsed("k", {"order_id": "o", "amount": 2}, "fp"))
    assert parsed.validated == OrderPaid(order_id="o", amount=2)
    dataclass_body = shape_of(typed_handlers.pack).body
    assert dataclass_body is not None
    assert dataclass_body.validate(Parsed("k", {"order_id": "o", "grams": 1}, "fp")).validated == (
        Parcel("o", 1)
    )


def test_an_invalid_body_names_its_errors_never_its_values() -> None:
    body = shape_of(typed_handlers.charge).body
    assert body is not None
    secret = "s3cr3t-value"
    with pytest.raises(InvalidBody) as raised:
        body.validate(Parsed("k", {"order_id": 5, "amount": secret, secret: 1}, "fp"))
    bad = raised.value
    assert bad.reason is Reason.INVALID_BODY
    assert str(bad) == (
        "body is not a valid OrderPaid: 2 validation errors (see x-semel-validation-errors)"
    )
    errors = orjson.loads(bad.errors)
    assert [e["loc"] for e in errors] == [["order_id"], ["amount"]]
    assert all(e.keys() == {"loc", "type", "msg"} for e in errors)
    assert secret not in bad.errors


class Strict(BaseModel):
    n: int

    def model_post_init(self, _context: Any) -> None:
        raise KeyError("secret")


def test_a_validator_that_raises_is_an_invalid_body_too() -> None:
    def handler(body: Strict) -> None: ...

    shape = shape_of(handler)
    assert shape.body is not None
    with pytest.raises(InvalidBody) as raised:
        shape.body.validate(Parsed("k", {"n": 1}, "fp"))
    assert orjson.loads(raised.value.errors) == [
        {"loc": [], "type": "KeyError", "msg": "raised by a validator"}
    ]


def test_errors_are_bounded_and_stay_json() -> None:
    many = [{"loc": ("n", i), "type": "t", "msg": "m", "input": "x"} for i in range(50)]
    kept = orjson.loads(bounded_errors(many))
    assert len(kept) == MAX_ERRORS
    assert all("input" not in e for e in kept)

    long = [{"loc": ("f" * 100,), "type": "t", "msg": "é" * 1000} for _ in range(5)]
    text = bounded_errors(long)
    assert len(text.encode()) <= VALIDATION_ERRORS_LIMIT
    kept = orjson.loads(text)
    assert 1 <= len(kept) < 5
    assert kept[0] == {"loc": ["f" * 40], "type": "t", "msg": "é" * 160}

    huge = [{"loc": tuple("x" * 40 for _ in range(20)), "type": "t", "msg": "ü" * 160}]
    assert orjson.loads(bounded_errors(huge)) == [{"type": "t"}]
    assert bounded_errors([]) == "[]"


def test_the_dead_letter_carries_the_errors_header() -> None:
    @dataclasses.dataclass
    class Message:  # the properties dead_letter_copy reads
        body: bytes = b"{}"
        headers: dict[str, Any] = dataclasses.field(default_factory=dict)
        content_type: str | None = "application/json"
        content_encoding: str | None = None
        priority: int | None = None
        correlation_id: str | None = None
        reply_to: str | None = None
        message_id: str | None = None
        timestamp: None = None
        type: str | None = None
        app_id: str | None = None

    facts = Facts("k", 1, Origin("ex", "rk"), "2026-01-01T00:00:00+00:00")
    invalid = decide_bad_message(InvalidBody("detail", '[{"type":"missing"}]'))
    copy = dead_letter_copy(Message(), facts, invalid)  # type: ignore[arg-type]
    assert copy.headers[H_VALIDATION_ERRORS] == '[{"type":"missing"}]'
    assert invalid.reason is Reason.INVALID_BODY
    malformed = decide_bad_message(BadMessage(Reason.MALFORMED_BODY, "body is not JSON"))
    other = dead_letter_copy(Message(), facts, malformed)  # type: ignore[arg-type]
    assert H_VALIDATION_ERRORS not in other.headers

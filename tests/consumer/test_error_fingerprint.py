"""The error fingerprint of a dead letter: the exception's type and the handler's own frame.

The rule alone (:mod:`semel.consumer.delivery.error_site`), on exceptions
raised through made-up application and library modules; then a worker on the
real broker dead-lettering a handler's failure with both headers, and bad
input with neither.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import types
from collections.abc import Callable
from typing import Any

import pytest

from semel.consumer import names
from semel.consumer.delivery.decide import DeadLetter, Retry, RetryPolicy, decide_after_failure
from semel.consumer.delivery.error_site import ErrorSite, error_site, qualified_type
from semel.consumer.errors import HandlerTimeout, PermanentError
from semel.consumer.names import ERROR_FRAME_LIMIT, ERROR_TYPE_LIMIT, Reason, Topology
from semel.settings import Settings
from tests.consumer import fingerprint_handlers
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.harness import Broker, eventually
from tests.tools.conftest import semel

pytestmark = pytest.mark.timeout(60)


def _module(name: str, source: str) -> types.ModuleType:
    """A module called ``name`` (its frames say so), made from ``source``."""
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)  # noqa: S102 - test fixture
    return module


# A library, an application calling it, the application's handler, and semel
# calling the handler (so the traceback starts in semel, as in the pipeline).
VENDOR = _module(
    "vendorlib.transport",
    "def send(url):\n"  # 1
    "    raise ConnectionError('refused: ' + url)\n",  # 2
)
CLIENT = _module(
    "shopapp.payments",
    "class Client:\n"  # 1
    "    def charge(self):\n"  # 2
    "        return transport.send('https://pay')\n",  # 3
)
CLIENT.transport = VENDOR  # type: ignore[attr-defined]
HANDLERS = _module(
    "shopapp.handlers",
    "def handle(context):\n"  # 1
    "    return client.charge()\n",  # 2
)
HANDLERS.client = CLIENT.Client()  # type: ignore[attr-defined]
RUNNER = _module(
    "semel.consumer.delivery.made_up_runner",
    "def run(handler):\n"
    "    try:\n"
    "        handler(None)\n"
    "    except Exception as exc:\n"
    "        return exc\n"
    "    raise AssertionError('it did not fail')\n",
)


def failure_of(handler: Callable[[Any], Any]) -> BaseException:
    """What ``handler`` raised, caught in a frame of semel's, as the pipeline does."""
    exc: BaseException = RUNNER.run(handler)
    return exc


def test_the_frame_is_the_innermost_of_the_handlers_package_not_the_raising_line() -> None:
    exc = failure_of(HANDLERS.handle)
    assert error_site(exc, HANDLERS.handle) == ErrorSite(
        "ConnectionError", "shopapp.payments:Client.charge:3"
    )


def test_wrappers_lead_to_the_users_function() -> None:
    exc = failure_of(HANDLERS.handle)

    @functools.wraps(HANDLERS.handle)
    def wrapped(context: Any) -> Any:
        return HANDLERS.handle(context)

    class Charge:
        __module__ = "shopapp.handlers"

        def __call__(self, context: Any) -> Any:
            return HANDLERS.handle(context)

    # A wrapper of semel's own (a typed handler's) copies no __module__.
    semels = _module(
        "semel.consumer.delivery.made_up_wrapper",
        "class Wrapper:\n    def __init__(self, handler):\n        self.__wrapped__ = handler\n",
    )
    expected = "shopapp.payments:Client.charge:3"
    assert error_site(exc, semels.Wrapper(HANDLERS.handle)).frame == expected
    assert error_site(exc, wrapped).frame == expected
    assert error_site(exc, functools.partial(wrapped)).frame == expected
    assert error_site(exc, Charge()).frame == expected


def test_without_the_handlers_frames_the_outermost_frame_after_semels() -> None:
    """The handler's package unknown (or semel's own), or none of its frames in
    the traceback: the first code that is neither semel's nor the standard
    library's; none at all when there is no such frame."""
    exc = failure_of(HANDLERS.handle)
    assert error_site(exc, None).frame == "shopapp.handlers:handle:2"
    assert error_site(exc, qualified_type).frame == "shopapp.handlers:handle:2"
    vendor_only = failure_of(lambda context: VENDOR.send("x"))
    frame = error_site(vendor_only, HANDLERS.handle).frame
    assert frame is not None
    assert frame.startswith(f"{__name__}:"), frame
    assert "<lambda>" in frame
    stdlib_only = failure_of(json.loads)  # json.loads(None): a TypeError inside json
    assert error_site(stdlib_only, json.loads) == ErrorSite("TypeError", None)


def test_a_timeout_names_the_line_the_handler_was_waiting_on() -> None:
    """``HandlerTimeout`` is semel's, raised ``from None``; the cancellation it
    replaced ran through the handler's line."""
    waiting = _module(
        "shopapp.slow",
        "import asyncio\n"  # 1
        "async def handle(context):\n"  # 2
        "    await asyncio.sleep(10)\n",  # 3
    )

    async def run() -> BaseException:
        try:
            async with asyncio.timeout(0.01):
                await waiting.handle(None)
        except TimeoutError:
            try:
                raise HandlerTimeout("handler ran longer than 0.01s") from None
            except HandlerTimeout as exc:
                return exc
        raise AssertionError("no timeout")

    exc = asyncio.run(run())
    assert error_site(exc, waiting.handle) == ErrorSite(
        "semel.consumer.errors.HandlerTimeout", "shopapp.slow:handle:3"
    )


def test_types_are_qualified_and_both_headers_bounded() -> None:
    assert qualified_type(ValueError("x")) == "ValueError"
    assert qualified_type(json.JSONDecodeError("x", "", 0)) == "json.decoder.JSONDecodeError"
    assert qualified_type(PermanentError("x")) == "semel.consumer.errors.PermanentError"
    long_name = _module(
        "shopapp." + "deep." * 100 + "mod",
        "class " + "E" * 300 + "(Exception): pass\n"
        "def " + "f" * 300 + "(context):\n"
        "    raise " + "E" * 300 + "('x')\n",
    )
    handler = getattr(long_name, "f" * 300)
    exc = failure_of(handler)
    found = error_site(exc, handler)
    assert len(found.error_type.encode()) == ERROR_TYPE_LIMIT
    assert found.frame is not None
    assert len(found.frame.encode()) == ERROR_FRAME_LIMIT


def test_only_a_handlers_dead_letter_keeps_the_site() -> None:
    policy = RetryPolicy((1.0,), max_attempts=2)
    found = ErrorSite("ValueError", "shopapp.handlers:handle:2")
    assert isinstance(decide_after_failure(ValueError("x"), 1, policy, found), Retry)
    last = decide_after_failure(ValueError("x"), 2, policy, found)
    assert isinstance(last, DeadLetter)
    assert (last.reason, last.site) == (Reason.MAX_ATTEMPTS, found)
    permanent = decide_after_failure(PermanentError("x"), 1, policy, found)
    assert isinstance(permanent, DeadLetter)
    assert (permanent.reason, permanent.site) == (Reason.PERMANENT_ERROR, found)


def _line(marker: str) -> int:
    """The line of ``fingerprint_handlers`` that carries ``# line: marker``."""
    source = inspect.getsource(fingerprint_handlers).splitlines()
    return next(n for n, text in enumerate(source, 1) if text.endswith(f"# line: {marker}"))


async def wait_for_dead_letters(broker: Broker, settings: Settings, count: int) -> None:
    dlq = Topology(settings.queue).dead_letter_queue

    async def arrived() -> bool:
        return await broker.depth(dlq) >= count

    await eventually(arrived, what=f"{count} dead letters")


@pytest.mark.parametrize("handler", ["charge_async", "charge_plain", "charge_typed"])
async def test_a_failing_handler_is_dead_lettered_with_its_type_and_frame(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    start_consumer: StartConsumer,
    handler: str,
) -> None:
    settings = consumer_settings(handler=f"tests.consumer.fingerprint_handlers:{handler}")
    await start_consumer(settings)
    await broker.publish(settings, {"reply": "{not json"}, key="decode")
    await broker.publish(settings, {"permanent": True}, key="declined")
    # Bad input has no exception: its reason is its group, whatever it arrived with.
    forged = {names.H_ERROR_TYPE: "Forged", names.H_ERROR_FRAME: "forged:f:1"}
    await broker.publish(settings, b"{broken", key="malformed", headers=forged)
    await wait_for_dead_letters(broker, settings, 3)

    letters = {letter.key: letter.headers for letter in await broker.dead_letters(settings)}
    module = "tests.consumer.fingerprint_handlers"
    decode = letters["decode"]
    assert decode[names.H_REASON] == Reason.MAX_ATTEMPTS.value
    assert decode[names.H_ERROR_TYPE] == "json.decoder.JSONDecodeError"
    assert decode[names.H_ERROR_FRAME] == f"{module}:_gateway:{_line('decode')}"
    declined = letters["declined"]
    assert declined[names.H_REASON] == Reason.PERMANENT_ERROR.value
    assert declined[names.H_ERROR_TYPE] == "semel.consumer.errors.PermanentError"
    assert declined[names.H_ERROR_FRAME] == f"{module}:_gateway:{_line('permanent')}"
    malformed = letters["malformed"]
    assert malformed[names.H_REASON] == Reason.MALFORMED_BODY.value
    assert names.H_ERROR_TYPE not in malformed
    assert names.H_ERROR_FRAME not in malformed


async def test_semel_dlq_groups_reads_the_workers_fingerprints(
    settings: Settings, broker: Broker, start_consumer: StartConsumer
) -> None:
    settings = settings.model_copy(
        update={"handler": "tests.consumer.fingerprint_handlers:charge_async"}
    )
    await start_consumer(settings)
    for n in range(3):
        await broker.publish(settings, {"reply": "{not json"}, key=f"decode-{n}")
    await broker.publish(settings, {"permanent": True}, key="declined")
    await broker.publish(settings, b"{broken", key="malformed")
    await wait_for_dead_letters(broker, settings, 5)

    done = await semel(settings, "dlq", "groups", "--json")
    assert done.code == 0, done.stderr
    shown = json.loads(done.stdout)
    assert (shown["read"], shown["matched"]) == (5, 5)
    found = [(g["count"], g["reason"], g["error_type"], g["error_frame"]) for g in shown["groups"]]
    module = "tests.consumer.fingerprint_handlers"
    assert found[0] == (
        3, "max-attempts", "json.decoder.JSONDecodeError", f"{module}:_gateway:{_line('decode')}"
    )  # fmt: skip
    assert sorted(found[1:], key=str) == sorted(
        [
            (1, "malformed-body", None, None),
            (
                1,
                "permanent-error",
                "semel.consumer.errors.PermanentError",
                f"{module}:_gateway:{_line('permanent')}",
            ),
        ],
        key=str,
    )
    assert shown["groups"][0]["sample_key"].startswith("decode-")
    await wait_for_dead_letters(broker, settings, 5)  # every one left in the DLQ

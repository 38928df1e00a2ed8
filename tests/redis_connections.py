"""A pytest plugin: a test that leaves a redis-py connection open fails, with where it opened.

A connection that nobody closed is closed by the garbage collector, which
warns (``ResourceWarning``, an error under ``filterwarnings = error``) in
whichever test happens to run then, usually a later one on the same worker,
with nothing to say where the connection came from. This plugin records
where each connection (redis-py's asyncio ones and its blocking ones) opens:
the test, and a short stack of the task that opened it. After a test's
teardown, one that opened during it and is still open fails that test
with that stack: held open by something still alive, or garbage the
collector is then made to finalize, so that its warnings land in that
test too.

It costs little: a stack is taken per connection opened (pools keep them),
and the collector runs only after a test that left a connection open.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import sys
import sysconfig
import traceback
import weakref
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio.connection
import redis.connection

FRAMES = 8
"""Frames of the opening stack shown outside the libraries: the innermost ones."""
LIBRARY_FRAMES = 12
"""Frames inside the libraries shown, one line each, under the innermost of the others:
which redis-py call opened the connection (a pool's, a sentinel's)."""
_LIBRARIES = tuple(
    {sysconfig.get_paths()[kind] for kind in ("stdlib", "purelib", "platlib", "scripts")}
)
_SELF = str(Path(__file__).resolve())


@dataclass(frozen=True)
class Opened:
    """A connection opened during the running test, and where."""

    connection: weakref.ReferenceType[Any]
    where: str

    def alive_and_open(self) -> bool:
        connection = self.connection()
        return connection is not None and _is_open(connection)


def _is_open(connection: Any) -> bool:
    # What redis-py's asyncio connection warns about when collected, and a blocking one's socket.
    return getattr(connection, "_writer", None) is not None or (
        getattr(connection, "_sock", None) is not None
    )


def _where() -> str:
    """The opening task, and the innermost frames of its stack: outside the libraries, then
    in them."""
    frames = [
        frame
        for frame in traceback.extract_stack(sys._getframe(1), limit=60)
        if frame.filename != _SELF and not frame.filename.startswith("<")
    ]
    ours = [i for i, frame in enumerate(frames) if not frame.filename.startswith(_LIBRARIES)]
    inner = frames[ours[-1] + 1 :] if ours else frames
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no loop: a blocking client's connection
        task = None
    head = f"opened in {task.get_name()} ({task.get_coro()!r})" if task else "opened"
    lines = traceback.format_list([frames[i] for i in ours[-FRAMES:]])
    lines += [
        f"    > {_in_library(f.filename)}:{f.lineno} {f.name}\n" for f in inner[-LIBRARY_FRAMES:]
    ]
    return head + " at\n" + "".join(lines)


def _in_library(filename: str) -> str:
    """``filename`` from its library's root: ``redis/asyncio/sentinel.py``."""
    root = next((lib for lib in _LIBRARIES if filename.startswith(lib)), "")
    return filename[len(root) :].lstrip("/")


class Tracker:
    """The connections opened since the current test began, except a wider fixture's."""

    def __init__(self) -> None:
        self.opened: list[Opened] = []
        self._wider_fixtures = 0  # set-ups under way of fixtures that outlive one test

    def restart(self) -> None:
        self.opened = []

    def record(self, connection: Any) -> None:
        if self._wider_fixtures == 0:
            self.opened.append(Opened(weakref.ref(connection), _where()))

    @contextlib.contextmanager
    def in_wider_fixture(self) -> Iterator[None]:
        """A fixture that outlives the test is being set up: its connections are not the test's."""
        self._wider_fixtures += 1
        try:
            yield
        finally:
            self._wider_fixtures -= 1

    def left_open(self) -> str | None:
        """Which connections were left open, held still or garbage (then finalized here:
        the collector runs only if one is left), and what the finalizers said."""
        candidates = [o for o in self.opened if o.alive_and_open()]
        self.opened = []
        if not candidates:
            return None
        said = _finalized()
        found = [
            f"still open after the test's teardown, {o.where}"
            for o in candidates
            if o.alive_and_open()
        ]
        found += [
            f"never closed, collected unclosed, {o.where}"
            for o in candidates
            if o.connection() is None
        ]
        report = f"{len(candidates)} redis-py connection(s) left open:\n\n" + "\n".join(found)
        if said:
            report += "\nthe collector then finalized, with an error:\n" + "\n".join(said)
        return report


def _finalized() -> list[str]:
    """Collect the garbage; what its finalizers raised (a ``ResourceWarning`` under
    ``filterwarnings = error``), caught here so that it is reported in this test."""
    said: list[str] = []

    def caught(unraisable: Any) -> None:
        what = unraisable.err_msg or "Exception ignored in"
        said.append(f"{what}: {unraisable.object!r}: {unraisable.exc_value!r}")

    previous, sys.unraisablehook = sys.unraisablehook, caught
    try:
        gc.collect()
    finally:
        sys.unraisablehook = previous
    return said


def _track_async(tracker: Tracker) -> Callable[[], None]:
    cls = redis.asyncio.connection.AbstractConnection
    original = cls.connect_check_health

    @functools.wraps(original)
    async def connect_check_health(self: Any, *args: Any, **kwargs: Any) -> Any:
        was_open = _is_open(self)
        try:
            return await original(self, *args, **kwargs)
        finally:  # a connect cut short after the socket opened leaves it open too
            if not was_open and _is_open(self):
                tracker.record(self)

    cls.connect_check_health = connect_check_health  # type: ignore[method-assign]
    return lambda: setattr(cls, "connect_check_health", original)


def _track_blocking(tracker: Tracker) -> Callable[[], None]:
    cls = redis.connection.AbstractConnection
    original = cls.connect_check_health

    @functools.wraps(original)
    def connect_check_health(self: Any, *args: Any, **kwargs: Any) -> Any:
        was_open = _is_open(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            if not was_open and _is_open(self):
                tracker.record(self)

    cls.connect_check_health = connect_check_health  # type: ignore[method-assign]
    return lambda: setattr(cls, "connect_check_health", original)


class LeftOpen(AssertionError):
    """A test left a redis-py connection open."""


class Plugin:
    """The hooks; registered by ``tests/conftest.py``."""

    def __init__(self) -> None:
        self.tracker = Tracker()
        self._untrack: list[Callable[[], None]] = []

    def pytest_configure(self, config: pytest.Config) -> None:
        self._untrack = [_track_async(self.tracker), _track_blocking(self.tracker)]

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        for untrack in self._untrack:
            untrack()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.tracker.restart()

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, Any, Any]:
        if fixturedef.scope == "function":
            return (yield)
        with self.tracker.in_wider_fixture():
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        try:
            yield
        finally:
            # After the fixtures' teardown and pytest's own report of what the collector
            # finalized with an error meanwhile; raised as this test's error (chained to
            # any error of the teardown).
            report = self.tracker.left_open()
            if report is not None:
                raise LeftOpen(report)

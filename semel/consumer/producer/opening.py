"""A publisher being opened: awaited, or entered with ``async with``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, Protocol, TypeVar


class Closable(Protocol):
    async def close(self) -> None: ...


T = TypeVar("T", bound=Closable)


class Opening(Generic[T]):
    """``await opening`` gives the opened object (the caller closes it);
    ``async with opening as it:`` closes it on the way out."""

    def __init__(self, open_: Callable[[], Awaitable[T]]) -> None:
        self._open = open_
        self._opened: T | None = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._open().__await__()

    async def __aenter__(self) -> T:
        self._opened = await self._open()
        return self._opened

    async def __aexit__(self, *_: object) -> None:
        opened, self._opened = self._opened, None
        if opened is not None:
            await opened.close()

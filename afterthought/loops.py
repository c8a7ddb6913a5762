"""Clients that belong to one event loop. ADK's ``Runner.run()`` starts a fresh loop per
call, and redis/httpx connections must not cross loops, so each loop gets its own."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """A value made lazily once per running loop and dropped with the loop."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._values: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        value = self._values.get(loop)
        if value is None:
            value = self._values[loop] = self._factory()
        return value

    def pop_current(self) -> T | None:
        """Forget (and return, for closing) the value of the running loop."""
        return self._values.pop(asyncio.get_running_loop(), None)

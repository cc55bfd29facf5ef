"""Waiting on virtual-time-free e2e conditions from async tests: one poll loop instead of one per file."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def until(condition: Callable[[], Any | Awaitable[Any]], what: str, timeout: float = 120.0) -> Any:
    """Poll `condition` (sync or async) every 0.1 s until it returns something truthy; that value.

    AssertionError naming `what` after `timeout` seconds of the running loop's clock.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        await asyncio.sleep(0.1)
    raise AssertionError(f"never: {what}")


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60.0, interval: float = 0.05) -> Any:
    """`until` for synchronous tests: poll `condition` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(interval)
    raise AssertionError(f"never: {what}")

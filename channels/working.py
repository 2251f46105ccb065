"""The "working" context every channel gives a turn: an indicator kept up until the turn ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable


@contextlib.asynccontextmanager
async def kept_up(show: Callable[[], Awaitable[None]], every: float, name: str
                  ) -> AsyncIterator[None]:
    """Call `show()` now and every `every` seconds while the block runs (a platform drops its
    "typing…" after a few seconds). `show` catches its own platform's errors: the indicator is
    cosmetic. The repeating task is gone when the block is left, so no indicator follows the
    reply."""

    async def repeat() -> None:
        while True:
            await show()
            await asyncio.sleep(every)

    task = asyncio.create_task(repeat(), name=name)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.wait([task])

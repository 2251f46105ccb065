"""What /healthz says, kept up to date in the background so a hit costs nothing.

A probe every `interval` seconds asks Ollama for its models and writes (and removes) a small
file in the state directory. /healthz, /metrics and the webhook's disk-full answer read the
result; a webhook that could not store an update asks for a new probe at once.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from daemon.core.errors import LLMError, ModelNotFound
from daemon.core.logs import app_log as log
from daemon.llm.client import ModelClient

MIN_FREE_BYTES = 1024 * 1024  # below this the disk counts as full: writes would soon fail


@dataclass
class Health:
    """The cached state; `reasons()` is empty when all is well."""

    ollama_reachable: bool | None = None  # None until the first probe
    model_pulled: bool | None = None
    disk_full: bool = False
    store_error: bool = False
    # Calls whose answer has been silent past `model.stall`, read live (not at the probe) so
    # that /healthz says it when the chat is told it (daemon/turn/silence.py).
    silent_calls: Callable[[], int] = field(default=lambda: 0, repr=False, compare=False)

    def reasons(self) -> list[str]:
        found = []
        if self.ollama_reachable is False:
            found.append("ollama unreachable")
        elif self.model_pulled is False:
            found.append("model not pulled")
        if self.silent_calls():
            found.append("model silent")
        if self.disk_full:
            found.append("disk full")
        if self.store_error:
            found.append("store error")
        return found


class HealthMonitor:
    """Probes Ollama and the state directory; `check_now()` wakes it early."""

    def __init__(self, llm: ModelClient, model: str, state_dir: Path, interval: float,
                 timeout: float = 5.0) -> None:
        self.health = Health(silent_calls=lambda: llm.gate.silent_calls)
        self.llm = llm
        self.model = model
        self.state_dir = state_dir
        self.interval = interval
        self.timeout = timeout
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.probe()
        self._task = asyncio.create_task(self._loop(), name="roost-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def check_now(self) -> None:
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.probe()
            except Exception:  # the boundary of a background job: the next probe tries again
                log.exception("health probe failed; trying again in %.0fs", self.interval)

    async def probe(self) -> None:
        h = self.health
        before = h.reasons()
        try:
            async with asyncio.timeout(self.timeout):
                pulled = await self.llm.pulled_models()
                await self.llm.learn_version()  # asked once; the console names it
            h.ollama_reachable = True
            h.model_pulled = self.model in pulled or f"{self.model}:latest" in pulled
        except ModelNotFound:
            h.ollama_reachable, h.model_pulled = True, False
        except (LLMError, TimeoutError):
            h.ollama_reachable = False
        h.disk_full, h.store_error = await asyncio.to_thread(disk_state, self.state_dir)
        after = h.reasons()
        if after != before:
            if after:
                log.warning("degraded: %s", ", ".join(after))
            elif before:
                log.info("healthy again")


def disk_state(state_dir: Path) -> tuple[bool, bool]:
    """(disk full, other write error) for the state directory, by writing a probe file."""
    try:
        if shutil.disk_usage(state_dir).free < MIN_FREE_BYTES:
            return True, False
        probe = state_dir / ".health-probe"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"ok\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return True, False
        return False, True
    return False, False

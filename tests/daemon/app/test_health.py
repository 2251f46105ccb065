"""The health monitor's background probing outlives a failing probe."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from daemon.app.health import HealthMonitor
from daemon.llm.client import ModelClient
from tests.conftest import SettingsFactory
from tests.fakes.ollama import FakeOllama


class ProbeBug(Exception):
    """Stands for a bug in one probe."""


class OnceBroken(HealthMonitor):
    """A monitor whose second probe (the first in the background) hits a bug."""

    probes = 0

    async def probe(self) -> None:
        self.probes += 1
        if self.probes == 2:
            raise ProbeBug("a bug in a probe")
        await super().probe()


async def test_a_probe_that_fails_is_logged_with_its_traceback_and_probing_goes_on(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, state_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    llm = ModelClient(make_settings(model={"host": fake_ollama.url}).model)
    monitor = OnceBroken(llm, "test-model", state_dir, interval=3600)
    try:
        with caplog.at_level(logging.ERROR, logger="roost"):
            await monitor.start()
            async with asyncio.timeout(10):
                while monitor.probes < 3:  # each wake is one more probe, if the loop lives
                    monitor.check_now()
                    await asyncio.sleep(0.01)
        assert monitor.health.ollama_reachable is True
        assert any(r.exc_info and isinstance(r.exc_info[1], ProbeBug) for r in caplog.records)
    finally:
        await monitor.stop()
        await llm.close()

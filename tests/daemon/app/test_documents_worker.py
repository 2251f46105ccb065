"""`roost run` starts a document worker once it has settled in (`Tuning.documents_warm_after`),
so the first PDF sent is read by a warm one, and stops it on SIGTERM with everything else."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from daemon.app.serve import Tuning, serve
from daemon.parsing.pool import shared_pool
from tests.conftest import SettingsFactory, wait_until
from tests.daemon.app.test_app import free_port
from tests.fakes.ollama import FakeOllama


async def test_the_daemon_warms_a_document_worker_and_stops_it(
        make_settings: SettingsFactory, fake_ollama: FakeOllama) -> None:
    settings = make_settings(daemon={"listen_host": "127.0.0.1", "listen_port": free_port(),
                                     "shutdown_grace": 2.0},
                             model={"host": fake_ollama.url})
    shared_pool().close()  # none left over from another test
    running = asyncio.create_task(serve(settings, tuning=Tuning(documents_warm_after=0.1)))
    # The worker starts after the signal handlers are in place: SIGTERM then reaches serve().
    await wait_until(lambda: bool(shared_pool().idle_pids()) or running.done(), timeout=30)
    assert not running.done()
    (pid,) = shared_pool().idle_pids()
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(running, 30) == 0
    assert shared_pool().idle_pids() == []
    assert not await asyncio.to_thread(Path(f"/proc/{pid}").exists)

"""`roost run`, `roost chat` on its own and `roost automations run` offer the model the same
capabilities: one prefix for everyone (issue 31), whichever command put the core together."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path
from typing import Any

from tests.channels.test_console import read_until, start_chat
from tests.conftest import wait_until
from tests.daemon.app.test_app import free_port
from tests.fakes.ollama import FakeOllama

CAPABILITIES = re.compile(r"<capabilities>\n(.*?)\n</capabilities>", re.S)


def write_config(tmp_path: Path, host: str) -> Path:
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                      f'listen = "127.0.0.1:{free_port()}"\n[model]\nhost = "{host}"\n'
                      # the quiet probe's requests are not the chats' this test compares
                      'probe_new = false\n'
                      '[[automations]]\nname = "brief"\nschedule = "0 7 * * *"\n'
                      'prompt = "Anything new on the things I follow?"\n'
                      'deliver = ["console:local"]\n')
    return config


def offered(request: dict[str, Any]) -> tuple[str, list[str]]:
    """The capability index in the system message, and the names of the tools sent."""
    system = request["messages"][0]
    assert system["role"] == "system"
    found = CAPABILITIES.search(system["content"])
    assert found, system["content"]
    return found.group(1), sorted(t["function"]["name"] for t in request.get("tools") or [])


async def chat_once(config: Path, line: str) -> None:
    chat = await start_chat(config)
    assert chat.stdin and chat.stdout
    chat.stdin.write(line.encode() + b"\n")
    await read_until(chat.stdout, f"echo: {line}", timeout=30)
    chat.stdin.close()
    assert await asyncio.wait_for(chat.wait(), 30) == 0


async def test_run_chat_and_automations_run_offer_the_same_capabilities_and_tools(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    config = write_config(tmp_path, fake_ollama.url)
    # `roost chat` with no daemon running: it puts the core together itself.
    await chat_once(config, "alone")
    alone = offered(fake_ollama.chat_requests[-1])
    # `roost automations run` with no daemon running: the same, for one run.
    command = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "automations", "run", "brief", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(command.communicate(), 60)
    assert command.returncode == 0, err.decode()
    run_now = offered(fake_ollama.chat_requests[-1])
    # `roost run`, and a chat through its socket.
    daemon = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "run", "--config", str(config),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        await wait_until((tmp_path / "state" / "chat.sock").exists, timeout=30)
        await chat_once(config, "through the daemon")
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(daemon.wait(), 30) == 0
    served = offered(fake_ollama.chat_requests[-1])
    assert "remind" in served[0]  # the daemon's reminders are among them
    assert alone == served
    assert run_now == served

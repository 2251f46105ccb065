"""An automation uses MCP tools that need no yes, and cannot run one that does: nobody is there
to ask. `roost automations run` gets the same tools as a scheduled run."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from daemon.cli.automation_run import run_automation
from daemon.core.config import McpServerSettings, McpSettings
from tests.automations.conftest import automation
from tests.conftest import SettingsFactory
from tests.fakes.mcp_results import unlabelled
from tests.fakes.ollama import FakeOllama, Reply

SERVER = Path(__file__).resolve().parents[1] / "fakes" / "mcp_server.py"


def calls(*steps: tuple[str, dict[str, Any]]) -> list[Reply]:
    return [Reply(tool_calls=[{"function": {"name": n, "arguments": a}}]) for n, a in steps]


async def test_a_run_uses_never_tools_and_refuses_the_ones_that_ask(
    make_settings: SettingsFactory, fake_ollama: FakeOllama, capsys: pytest.CaptureFixture[str]
) -> None:
    server = McpServerSettings(name="fake", command=sys.executable, args=(str(SERVER),),
                               approve_tools={"echo": "never"})
    settings = dataclasses.replace(make_settings(model={"host": fake_ollama.url}),
                                   automations=(automation("brief"),),
                                   mcp=McpSettings(servers=(server,)))
    fake_ollama.script(*calls(("tool_activate", {"name": "fake"}),
                              ("fake__echo", {"text": "hourly"}), ("fake__fail", {})),
                       Reply("Report: all quiet."))
    assert await run_automation(settings, "brief") == 0
    assert "Report: all quiet." in capsys.readouterr().out
    tools = [unlabelled(m["content"]) for m in fake_ollama.chat_requests[-1]["messages"]
             if m["role"] == "tool"]
    assert "echo: hourly" in tools
    assert any("fake__fail needs the user's approval" in t and "not run" in t for t in tools)

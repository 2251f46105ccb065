"""`roost chat` asks to approve an MCP tool call on the terminal: y, a or n on the next line."""

from __future__ import annotations

import sys
from pathlib import Path

from daemon.store import Store
from daemon.store.approvals import ApprovalBook
from tests.channels.test_console import read_until, start_chat
from tests.fakes.mcp_results import unlabelled
from tests.fakes.ollama import FakeOllama, Reply

SERVER = Path(__file__).resolve().parents[1] / "fakes" / "mcp_server.py"


def write_config(tmp_path: Path, host: str) -> Path:
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n\n[model]\nhost = "{host}"\n'
                      f'\n[mcp.servers.fake]\ncommand = "{sys.executable}"\nargs = ["{SERVER}"]\n'
                      '\n[mcp.servers.gone]\ncommand = "/nonexistent/mcp"\n')
    return config


def call(tool: str, **arguments: object) -> Reply:
    return Reply(tool_calls=[{"function": {"name": tool, "arguments": arguments}}])


async def test_y_allows_once_a_always_and_n_denies(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    fake_ollama.script(call("tool_activate", name="fake"), call("fake__echo", text="one"),
                       Reply("First done."), call("fake__echo", text="two"),
                       Reply("Second done."), call("fake__echo", text="three"),
                       Reply("Third done."))
    chat = await start_chat(write_config(tmp_path, fake_ollama.url))
    assert chat.stdin and chat.stdout and chat.stderr
    await read_until(chat.stdout, "Ctrl-D to leave", timeout=60)  # a loaded machine: slow start
    chat.stdin.write(b"echo one\n")
    asked = await read_until(chat.stdout, "[n] Deny")
    assert "fake__echo" in asked and "[y] Allow once" in asked
    chat.stdin.write(b"y\n")
    await read_until(chat.stdout, "First done.")
    chat.stdin.write(b"echo two\n")
    await read_until(chat.stdout, "[n] Deny")
    chat.stdin.write(b"n\n")
    await read_until(chat.stdout, "Second done.")
    chat.stdin.write(b"echo three\n")
    await read_until(chat.stdout, "[n] Deny")
    chat.stdin.write(b"a\n")
    await read_until(chat.stdout, "Third done.")
    chat.stdin.close()
    await read_until(chat.stdout, "Saved. Bye.")
    assert await chat.wait() == 0
    errors = (await chat.stderr.read()).decode()
    assert "MCP server gone is not available: command not found" in errors

    tools = [unlabelled(m["content"]) for r in fake_ollama.chat_requests for m in r["messages"]
             if m["role"] == "tool"]
    assert "echo: one" in tools and "echo: three" in tools
    assert not any(t == "echo: two" for t in tools)
    assert any("denied" in t for t in tools)
    standing = ApprovalBook(tmp_path / "state").standing()
    assert [(s.person, s.tool) for s in standing] == [("console:local", "fake__echo")]
    with Store.open(tmp_path / "state", read_only=True) as store:
        (conversation,) = store.list_conversations(chat_key="console:local")
        assert "fake" in conversation.active_tools  # the activation is kept for later turns


async def test_a_line_that_is_no_answer_is_told_what_the_question_waits_for(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    fake_ollama.script(call("tool_activate", name="fake"), call("fake__echo", text="one"),
                       Reply("First done."), Reply("Now to your question."))
    chat = await start_chat(write_config(tmp_path, fake_ollama.url))
    assert chat.stdin and chat.stdout
    await read_until(chat.stdout, "Ctrl-D to leave", timeout=60)  # a loaded machine: slow start
    chat.stdin.write(b"echo one\n")
    await read_until(chat.stdout, "[n] Deny")
    chat.stdin.write(b"what is taking so long?\n")
    await read_until(chat.stdout, "waiting for your answer to the question above; type y, a "
                                  "or n, or /stop")
    chat.stdin.write(b"y\n")
    shown = await read_until(chat.stdout, "Now to your question.", 30)
    assert shown.index("First done.") < shown.index("Now to your question.")
    assert "what is taking so long?" in str(fake_ollama.chat_requests[-1]["messages"])
    chat.stdin.close()
    assert await chat.wait() == 0

"""`roost chat` driven through a pipe, as a person at a terminal would use it."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import platform
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from daemon.store import Store
from tests.conftest import wait_until
from tests.fakes.ollama import FakeOllama, Reply


def write_config(tmp_path: Path, host: str) -> Path:
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n\n[model]\nhost = "{host}"\n')
    return config


_started: list[asyncio.subprocess.Process] = []  # this worker's `roost chat`s, ended by each test


@pytest.fixture(autouse=True)
async def no_chat_left() -> AsyncIterator[None]:
    """A test that failed half-way leaves no `roost chat` running, nor its pipes open (they
    failed the next test on the worker with ResourceWarnings)."""
    yield
    while _started:
        process = _started.pop()
        if process.returncode is None:
            process.kill()
        await asyncio.wait_for(process.communicate(), 60)


async def start_chat(config: Path) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "chat", "--config", str(config),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _started.append(process)
    return process


# A minute: `roost chat` starts in about two seconds, but far slower on a loaded machine
# (the suite with -n 4 on two cores).
async def read_until(stream: asyncio.StreamReader, marker: str, timeout: float = 60) -> str:  # noqa: ASYNC109
    seen = ""
    async with asyncio.timeout(timeout):
        while marker not in seen:
            chunk = await stream.read(256)
            if not chunk:
                break
            seen += chunk.decode()
    assert marker in seen, seen
    return seen


async def test_a_reply_streams_new_starts_a_conversation_and_exit_saves(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    fake_ollama.script(Reply(content="Hello from the model, streamed in pieces", chunks=6,
                             chunk_delay=0.05))
    chat = await start_chat(write_config(tmp_path, fake_ollama.url))
    assert chat.stdin and chat.stdout and chat.stderr
    await read_until(chat.stdout, "Ctrl-D to leave")
    chat.stdin.write(b"hi there\n")
    # The first pieces arrive before the whole reply exists: that is streaming.
    partial = await read_until(chat.stdout, "roost> Hello")
    assert "streamed in pieces" not in partial
    await read_until(chat.stdout, "streamed in pieces")
    chat.stdin.write(b"/new\n")
    await read_until(chat.stdout, "Started a new conversation")
    chat.stdin.write(b"second conversation\n")
    await read_until(chat.stdout, "echo: second conversation")
    chat.stdin.close()  # Ctrl-D
    rest = await asyncio.wait_for(chat.stdout.read(), 10)
    assert b"Saved. Bye." in rest
    assert await asyncio.wait_for(chat.wait(), 10) == 0

    with Store.open(tmp_path / "state", read_only=True) as store:
        first, second = store.list_conversations(chat_key="console:local")
        assert first.status == "archived" and second.status == "active"
        assert [m.content for m in store.messages(first.id)] == [
            "hi there", "Hello from the model, streamed in pieces"]
        assert [m.content for m in store.messages(second.id)] == [
            "second conversation", "echo: second conversation"]


async def test_status_and_help(fake_ollama: FakeOllama, tmp_path: Path) -> None:
    chat = await start_chat(write_config(tmp_path, fake_ollama.url))
    assert chat.stdin and chat.stdout
    chat.stdin.write(b"/help\n/status\n")
    chat.stdin.close()
    out = (await asyncio.wait_for(chat.stdout.read(), 10)).decode()
    assert await chat.wait() == 0
    assert "/new - start a fresh conversation" in out
    assert "Model: qwen3:4b" in out and "Window: 8,192 tokens" in out
    assert fake_ollama.chat_requests == []  # commands never reach the model


async def test_interrupt_at_the_prompt_leaves_cleanly(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    """Ctrl-C with no reply on its way leaves, as Ctrl-D does (during a reply it stops the
    reply: see below)."""
    chat = await start_chat(write_config(tmp_path, fake_ollama.url))
    assert chat.stdin and chat.stdout
    await read_until(chat.stdout, "Ctrl-D to leave")  # at the prompt: nothing being written
    chat.send_signal(signal.SIGINT)
    await read_until(chat.stdout, "Saved. Bye.")
    chat.stdin.close()  # the thread reading a pipe holds the process until the pipe ends
    assert await asyncio.wait_for(chat.wait(), 10) == 0


def _thread_reading_stdin(pid: int) -> int | None:
    """The thread of `pid` blocked in read(2) on fd 0 (x86-64 numbers), if there is one."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            fields = (task / "syscall").read_text().split()
            if int(task.name) != pid and fields[:2] == ["0", "0x0"]:
                return int(task.name)
    return None


def _syscalls_readable(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/task/{pid}/syscall").read_text()
    except PermissionError:
        return False
    return True


@pytest.mark.skipif(platform.machine() != "x86_64" or not hasattr(ctypes.CDLL(None), "tgkill"),
                    reason="finds the reading thread by x86-64 syscall numbers; needs tgkill")
async def test_ctrl_c_that_lands_on_the_thread_reading_the_terminal_still_leaves(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    """The kernel hands a Ctrl-C to any of the process's threads; the one blocked reading the
    prompt must not swallow it (the loop sleeps on until something else wakes it)."""
    chat = await start_chat(write_config(tmp_path, fake_ollama.url))
    assert chat.stdin and chat.stdout
    await read_until(chat.stdout, "Ctrl-D to leave")
    if not _syscalls_readable(chat.pid):  # roost makes itself non-dumpable: only root may look
        pytest.skip("reading another process's syscall needs root (roost is non-dumpable)")
    await wait_until(lambda: _thread_reading_stdin(chat.pid) is not None)
    reader = _thread_reading_stdin(chat.pid)
    assert ctypes.CDLL(None, use_errno=True).tgkill(chat.pid, reader, signal.SIGINT) == 0
    await read_until(chat.stdout, "Saved. Bye.")
    chat.stdin.close()
    assert await asyncio.wait_for(chat.wait(), 10) == 0


async def test_unreachable_ollama_is_one_line_naming_the_host_and_the_chat_starts(
    tmp_path: Path
) -> None:
    chat = await start_chat(write_config(tmp_path, "http://127.0.0.1:9"))
    out, err = await asyncio.wait_for(chat.communicate(b""), 20)  # b"": Ctrl-D at once
    assert chat.returncode == 0 and b"Ctrl-D to leave" in out  # the prompt, not an exit
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1
    assert "http://127.0.0.1:9" in lines[0] and "ollama serve" in lines[0]


async def test_a_note_added_after_a_streamed_reply_is_shown(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    fake_ollama.default_reply = lambda body: Reply(content="part. ", done_reason="length")
    chat = await start_chat(write_config(tmp_path, fake_ollama.url))
    assert chat.stdin and chat.stdout
    chat.stdin.write(b"go on and on\n")
    chat.stdin.close()
    out = (await asyncio.wait_for(chat.stdout.read(), 20)).decode()
    assert await chat.wait() == 0
    assert "roost> part. part. part. part. " in out
    assert "The answer was cut off; ask me to go on." in out


async def test_a_message_while_ollama_is_down_after_the_banner_is_told_and_answered(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    chat = await start_chat(write_config(tmp_path, fake_ollama.url))
    assert chat.stdin and chat.stdout and chat.stderr
    await read_until(chat.stdout, "Ctrl-D to leave")  # the start listed the models: Ollama was up
    await fake_ollama.refuse_connections()
    chat.stdin.write(b"are you there?\n")
    told = await read_until(chat.stdout, "[roost] The model server")
    await fake_ollama.accept_connections()
    told += await read_until(chat.stdout, "echo: are you there?")
    assert "not answering" in told and "saved" in told
    chat.stdin.close()
    await asyncio.wait_for(chat.stdout.read(), 10)
    assert await asyncio.wait_for(chat.wait(), 10) == 0


async def test_ctrl_c_during_a_reply_stops_the_reply_not_the_chat(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    answer = " ".join(f"word{i}" for i in range(2000))  # minutes at this pace
    fake_ollama.script(Reply(content=answer, tokens_per_second=40))
    chat = await start_chat(write_config(tmp_path, fake_ollama.url))
    assert chat.stdin and chat.stdout and chat.stderr
    await read_until(chat.stdout, "Ctrl-D to leave")
    chat.stdin.write(b"write a lot\n")
    await read_until(chat.stdout, "roost> word0 word1")
    chat.send_signal(signal.SIGINT)
    await read_until(chat.stdout, "(stopped)")
    assert fake_ollama.cancelled == 1  # the request to Ollama was closed
    chat.stdin.write(b"still there?\n")  # the chat goes on, and the model is free
    await read_until(chat.stdout, "echo: still there?")
    chat.stdin.close()
    rest = await asyncio.wait_for(chat.stdout.read(), 10)
    assert b"Saved. Bye." in rest
    assert await asyncio.wait_for(chat.wait(), 10) == 0

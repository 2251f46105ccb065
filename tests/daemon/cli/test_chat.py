"""`roost chat` at a real terminal (a pseudo-terminal), through a pipe, and while the daemon
runs: line editing and history, the indicator, unknown commands, an outage, the socket."""

from __future__ import annotations

import asyncio
import os
import pty
import signal
import stat
import sys
from pathlib import Path

from daemon.store import Store
from tests.channels.test_console import read_until, start_chat
from tests.conftest import wait_until
from tests.daemon.app.test_app import free_port
from tests.fakes.ollama import FakeOllama, Reply

LEFT, UP, CTRL_D = "\x1b[D", "\x1b[A", "\x04"


def write_config(tmp_path: Path, host: str) -> Path:
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                      f'listen = "127.0.0.1:{free_port()}"\n[model]\nhost = "{host}"\n')
    return config


class Terminal:
    """`roost chat` with a pseudo-terminal as stdin and stdout; stderr apart, in a pipe."""

    def __init__(self, process: asyncio.subprocess.Process, master: int) -> None:
        self.process, self.master, self.seen = process, master, ""

    async def read_until(self, marker: str, timeout: float = 15) -> str:  # noqa: ASYNC109
        loop = asyncio.get_running_loop()
        start = len(self.seen)
        async with asyncio.timeout(timeout):
            while marker not in self.seen[start:]:
                ready = asyncio.Event()
                loop.add_reader(self.master, ready.set)
                try:
                    await ready.wait()
                finally:
                    loop.remove_reader(self.master)
                try:
                    self.seen += os.read(self.master, 4096).decode(errors="replace")
                except OSError:  # the child closed the terminal
                    break
        assert marker in self.seen[start:], self.seen[start:]
        return self.seen[start:]

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())


async def open_terminal(config: Path, *, stderr_too: bool = False) -> Terminal:
    """stderr_too: stderr on the terminal as well, as in a real one (then it is not kept)."""
    master, slave = pty.openpty()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "chat", "--config", str(config),
        stdin=slave, stdout=slave, stderr=slave if stderr_too else asyncio.subprocess.PIPE,
        env={**os.environ, "TERM": "dumb"})
    os.close(slave)
    return Terminal(process, master)


async def close_terminal(terminal: Terminal) -> tuple[int, str]:
    err = (b"" if terminal.process.stderr is None
           else await asyncio.wait_for(terminal.process.stderr.read(), 15))
    status = await asyncio.wait_for(terminal.process.wait(), 15)
    os.close(terminal.master)
    return status, err.decode()


async def test_arrow_keys_edit_the_line_and_up_brings_back_the_history(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    config = write_config(tmp_path, fake_ollama.url)
    chat = await open_terminal(config)
    await chat.read_until("you> ")  # the prompt is on the terminal (stdout), not stderr
    chat.type(f"helo{LEFT}l\r")  # a typo mended with the arrow key
    shown = await chat.read_until("echo: hello")
    # On a terminal, the indicator shows until the first token, then makes way for it.
    assert "roost is thinking…" in shown
    await chat.read_until("you> ")
    chat.type(CTRL_D)
    status, err = await close_terminal(chat)
    assert status == 0 and "you>" not in err and "\x1b[D" not in chat.seen
    history = tmp_path / "state" / "chat_history"
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
    assert "hello" in history.read_text()

    again = await open_terminal(config)
    await again.read_until("you> ")
    again.type(f"{UP}\r")  # the last line of the previous session
    await again.read_until("echo: hello")
    await again.read_until("you> ")  # typed before readline reads, ^D would be a cooked EOF
    again.type(CTRL_D)
    assert (await close_terminal(again))[0] == 0
    with Store.open(tmp_path / "state", read_only=True) as store:
        (conversation,) = store.list_conversations(chat_key="console:local")
        assert [m.content for m in store.messages(conversation.id)][::2] == ["hello", "hello"]


async def test_an_unknown_command_is_answered_here_and_never_reaches_the_model(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    chat = await start_chat(write_config(tmp_path, fake_ollama.url))
    assert chat.stdin and chat.stdout
    chat.stdin.write(b"/bogus do things\n/help\n/etc/hosts has what?\n")
    chat.stdin.close()
    out = (await asyncio.wait_for(chat.stdout.read(), 15)).decode()
    assert await chat.wait() == 0
    assert "/bogus is not a command; /help lists them" in out
    assert "echo: /etc/hosts has what?" in out  # a path is words for the model, not a command
    assert "/new - start a fresh conversation" in out  # a known one still works
    assert "thinking" not in out  # no indicator through a pipe
    assert len(fake_ollama.chat_requests) == 1  # the path only


async def test_the_prompt_stays_while_ollama_is_down_and_the_messages_are_answered_after(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    await fake_ollama.refuse_connections()
    chat = await start_chat(write_config(tmp_path, fake_ollama.url))
    assert chat.stdin and chat.stdout and chat.stderr
    await read_until(chat.stdout, "Ctrl-D to leave", timeout=15)  # it starts anyway
    chat.stdin.write(b"are you there?\n")
    await read_until(chat.stdout, "[roost] The model server", timeout=15)
    # Back at the prompt while the message waits: a command is answered at once, and a
    # second message is taken.
    chat.stdin.write(b"/bogus\nstill there?\n")
    await read_until(chat.stdout, "/bogus is not a command", timeout=15)
    await fake_ollama.accept_connections()
    await read_until(chat.stdout, "echo: still there?", timeout=60)  # after the retry's pause
    chat.stdin.close()
    await asyncio.wait_for(chat.stdout.read(), 15)
    assert await asyncio.wait_for(chat.wait(), 15) == 0
    err = (await chat.stderr.read()).decode()
    assert "cannot reach Ollama" in err and "ollama serve" in err
    with Store.open(tmp_path / "state", read_only=True) as store:
        (conversation,) = store.list_conversations(chat_key="console:local")
        users = [m.content for m in store.messages(conversation.id) if m.role == "user"]
        assert users == ["are you there?", "still there?"]


async def test_an_outage_writes_nothing_onto_the_prompt_and_a_late_answer_gives_it_back(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    config = write_config(tmp_path, fake_ollama.url)
    chat = await open_terminal(config, stderr_too=True)
    await chat.read_until("you> ")
    await fake_ollama.refuse_connections()
    chat.type("are you there?\r")
    await chat.read_until("[roost] The model server")
    await chat.read_until("you> ")  # the prompt is back while the message waits
    chat.type("still")  # typing the next line when the retries go on
    await fake_ollama.accept_connections()
    late = await chat.read_until("echo: are you there?", timeout=60)
    after = await chat.read_until("you> still")  # the prompt and what was typed, drawn again
    # Every line a log or an answer wrote starts at the line's start, not after the prompt.
    screen = (late + after).replace("\r\x1b[K", "\n")
    assert not [line for line in screen.splitlines()
                if line.startswith("you> ") and line.removeprefix("you> ").strip()
                and "still" not in line], screen
    chat.type("\r")
    await chat.read_until("echo: still")
    await chat.read_until("you> ")
    chat.type(CTRL_D)
    assert (await close_terminal(chat))[0] == 0


async def test_chat_talks_to_the_running_daemon_over_its_socket(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    config = write_config(tmp_path, fake_ollama.url)
    daemon = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "run", "--config", str(config),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    socket = tmp_path / "state" / "chat.sock"
    try:
        # Bound, then made 0600 (inside the 0700 state directory meanwhile).
        await wait_until(lambda: socket.exists() and stat.S_IMODE(socket.stat().st_mode) == 0o600,
                         timeout=30)
        assert stat.S_IMODE(socket.parent.stat().st_mode) == 0o700
        fake_ollama.script(Reply(content="streamed through the daemon", chunks=4))
        chat = await start_chat(config)
        assert chat.stdin and chat.stdout and chat.stderr
        chat.stdin.write(b"hi daemon\n")
        await read_until(chat.stdout, "roost> streamed through the daemon", timeout=15)
        # One terminal at a time: a second is told so (and the first goes on).
        second = await start_chat(config)
        _, second_err = await asyncio.wait_for(second.communicate(b"hello\n"), 15)
        assert second.returncode == 73 and b"another roost chat is connected" in second_err
        chat.stdin.write(b"/bogus\nand again\n")
        chat.stdin.close()
        out = (await asyncio.wait_for(chat.stdout.read(), 15)).decode()
        assert "/bogus is not a command" in out and "echo: and again" in out
        assert await asyncio.wait_for(chat.wait(), 15) == 0
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(daemon.wait(), 30) == 0
    assert not socket.exists()
    with Store.open(tmp_path / "state", read_only=True) as store:
        (conversation,) = store.list_conversations(chat_key="console:local")
        assert [m.content for m in store.messages(conversation.id)] == [
            "hi daemon", "streamed through the daemon", "and again", "echo: and again"]


async def test_ctrl_c_stops_the_daemons_reply_and_the_chat_goes_on(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    config = write_config(tmp_path, fake_ollama.url)
    daemon = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "run", "--config", str(config),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        await wait_until((tmp_path / "state" / "chat.sock").exists, timeout=30)
        answer = " ".join(f"word{i}" for i in range(2000))  # minutes at this pace
        fake_ollama.script(Reply(content=answer, tokens_per_second=40))
        chat = await start_chat(config)
        assert chat.stdin and chat.stdout
        chat.stdin.write(b"write a lot\n")
        await read_until(chat.stdout, "roost> word0 word1", timeout=15)
        chat.send_signal(signal.SIGINT)  # the daemon's reply stops, not the terminal
        await read_until(chat.stdout, "(stopped)", timeout=15)
        await wait_until(lambda: fake_ollama.cancelled == 1, timeout=15)
        chat.stdin.write(b"still there?\n")
        await read_until(chat.stdout, "echo: still there?", timeout=15)
        chat.stdin.close()
        assert b"Saved. Bye." in await asyncio.wait_for(chat.stdout.read(), 15)
        assert await asyncio.wait_for(chat.wait(), 15) == 0
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(daemon.wait(), 30) == 0

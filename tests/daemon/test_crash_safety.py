"""SIGKILL at random moments loses nothing that was acknowledged and corrupts no file.

A child process (`crash_child.py`) appends to one conversation, now and then also to the inbox and
the outbox, and prints each write once it returned. The parent waits until the child has
acknowledged a random number of messages, then kills it with SIGKILL after a further random delay,
and checks what a restarted daemon would find. Counting acknowledgements rather than time keeps the
kills among the writes, and the run long enough to close segments, however loaded the machine is.

Replay a failure with the seed it prints: `ROOST_CRASH_SEED=<seed> pytest ...`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from channels.telegram.channel import SECRET_HEADER as TG_SECRET_HEADER
from channels.telegram.channel import WEBHOOK_PATH as TG_WEBHOOK_PATH
from daemon.store import Store
from tests.daemon.app.test_app import TG_SECRET, free_port
from tests.daemon.crash_child import content_for
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

CHILD = Path(__file__).with_name("crash_child.py")
CHAT = "telegram:1111111"
KILLS = 24
MIN_ACKS, MAX_ACKS = 1, 20  # messages a child acknowledges before the kill is armed
MIN_DELAY, MAX_DELAY = 0.0, 0.050


class Acked:
    """What the children acknowledged, over all runs."""

    def __init__(self) -> None:
        self.messages: dict[int, str] = {}
        self.inbox: set[str] = set()
        self.outbox: set[str] = set()

    def take(self, output: bytes) -> list[int]:
        """Record the complete lines of one child's output; return the message seqs it acked."""
        seqs = []
        for line in output.decode("utf-8").splitlines(keepends=True):
            if not line.endswith("\n"):
                break  # cut off by the kill: not acknowledged
            kind, _, rest = line.strip().partition(" ")
            if kind == "msg":
                seq, message_id = rest.split()
                self.messages[int(seq)] = message_id
                seqs.append(int(seq))
            elif kind == "inbox":
                self.inbox.add(rest)
            elif kind == "outbox":
                self.outbox.add(rest)
        return seqs


def read_until_ready(fd: int, deadline: float) -> bytes:
    buffer = b""
    while b"ready\n" not in buffer:
        left = deadline - time.monotonic()
        readable, _, _ = select.select([fd], [], [], max(left, 0))
        if not readable:
            raise AssertionError("the child did not open the store in time")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError(f"the child exited before opening the store: {buffer!r}")
        buffer += chunk
    return buffer.split(b"ready\n", 1)[1]


def read_until_acks(fd: int, output: bytes, count: int, deadline: float) -> bytes:
    """Read until `output` holds `count` acknowledged messages (a bounded wait)."""
    while output.count(b"\nmsg ") + output.startswith(b"msg ") < count:
        left = deadline - time.monotonic()
        readable, _, _ = select.select([fd], [], [], max(left, 0))
        if not readable:
            raise AssertionError(f"the child acknowledged fewer than {count} writes in time")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError("the child exited while writing")
        output += chunk
    return output


def read_to_end(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def check_files(state_dir: Path, where: str) -> int:
    """Every JSON file parses and nothing was moved aside; returns the number of temp files."""
    temp = 0
    for folder, _, names in os.walk(state_dir):
        for name in names:
            assert ".corrupt-" not in name, f"{where}: {folder}/{name} was moved aside"
            if name.endswith(".json"):
                json.loads((Path(folder) / name).read_bytes().decode("utf-8"))
            elif name.endswith(".tmp"):
                temp += 1
    return temp


def test_sigkill_never_loses_acknowledged_writes_or_corrupts_files(state_dir: Path) -> None:
    seed = int(os.environ.get("ROOST_CRASH_SEED", time.time_ns() % 2**32))
    print(f"crash test seed: ROOST_CRASH_SEED={seed}")
    rng = random.Random(seed)

    with Store.open(state_dir) as store:
        conversation = store.create_conversation(CHAT, time.time())

    acked = Acked()
    stored_count = 0
    temp_left = 0
    started = time.monotonic()
    for kill in range(1, KILLS + 1):
        acks = rng.randint(MIN_ACKS, MAX_ACKS)
        delay = rng.uniform(MIN_DELAY, MAX_DELAY)
        where = f"seed {seed}, kill {kill} after {acks} messages and {delay * 1000:.0f} ms"
        with subprocess.Popen(
            [sys.executable, str(CHILD), str(state_dir), conversation.id],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
        ) as child:
            assert child.stdout is not None and child.stderr is not None
            try:
                output = read_until_ready(child.stdout.fileno(), time.monotonic() + 20)
                output = read_until_acks(child.stdout.fileno(), output, acks,
                                         time.monotonic() + 20)
            except AssertionError:
                child.kill()
                child.wait()
                raise AssertionError(f"{where}: {child.stderr.read().decode()}") from None
            time.sleep(delay)
            child.send_signal(signal.SIGKILL)
            child.wait()
            output += read_to_end(child.stdout.fileno())
            errors = child.stderr.read().decode()
        assert child.returncode == -signal.SIGKILL, f"{where}: the child died by itself: {errors}"
        new_seqs = acked.take(output)
        if new_seqs:  # the child continued where the last one stopped
            assert new_seqs[0] == stored_count + 1, where

        # What a restarted daemon finds. Store.open also proves the kernel dropped the lock.
        with Store.open(state_dir) as store:
            messages = store.messages(conversation.id)
            assert [c.id for c in store.list_conversations()] == [conversation.id], where
            active = store.active_conversation(CHAT)
            assert active is not None and active.id == conversation.id, where
            inbox = {i["id"] for i in store.inbox_pending()}
            outbox = {i["id"] for i in store.outbox_pending()}

        assert [m.seq for m in messages] == list(range(1, len(messages) + 1)), where
        for message in messages:  # acknowledged or not, nothing is half-written
            assert message.content == content_for(message.seq), f"{where}: seq {message.seq}"
        for seq, message_id in acked.messages.items():
            assert seq <= len(messages), f"{where}: acknowledged message {seq} is lost"
            assert messages[seq - 1].id == message_id, f"{where}: seq {seq} has another id"
        # At most the one append in flight at the kill landed without its acknowledgement.
        assert len(messages) <= max(acked.messages, default=0) + 1, where
        assert acked.inbox <= inbox, f"{where}: lost inbox items {acked.inbox - inbox}"
        assert acked.outbox <= outbox, f"{where}: lost outbox items {acked.outbox - outbox}"
        temp_left = check_files(state_dir, where)
        stored_count = len(messages)

    elapsed = time.monotonic() - started
    segments = sorted((state_dir / "conversations" / conversation.id).glob("seg-*.json"))
    print(f"{KILLS} kills in {elapsed:.1f} s: {len(acked.messages)} acknowledged messages, "
          f"{stored_count} stored in {len(segments)} segments, "
          f"{len(acked.inbox)} inbox and {len(acked.outbox)} outbox items, "
          f"{temp_left} temp files left by kills")
    # The kills did land among writes, and segments were closed along the way.
    assert len(acked.messages) >= KILLS, f"seed {seed}: too few writes to prove anything"
    assert len(segments) >= 2, f"seed {seed}"


INTAKE_CHILD = Path(__file__).with_name("crash_intake_child.py")
INTAKE_KILLS = 10


def test_sigkill_during_group_commits_loses_no_acknowledged_update(state_dir: Path) -> None:
    seed = int(os.environ.get("ROOST_CRASH_SEED", time.time_ns() % 2**32))
    print(f"crash test seed: ROOST_CRASH_SEED={seed}")
    rng = random.Random(seed)
    Store.open(state_dir).close()
    acked: list[str] = []
    for kill in range(1, INTAKE_KILLS + 1):
        delay = rng.uniform(MIN_DELAY, MAX_DELAY)
        where = f"seed {seed}, kill {kill} after {delay * 1000:.0f} ms"
        with subprocess.Popen(
            [sys.executable, str(INTAKE_CHILD), str(state_dir), str(kill)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
        ) as child:
            assert child.stdout is not None and child.stderr is not None
            try:
                output = read_until_ready(child.stdout.fileno(), time.monotonic() + 20)
            except AssertionError:
                child.kill()
                child.wait()
                raise AssertionError(f"{where}: {child.stderr.read().decode()}") from None
            time.sleep(delay)
            child.send_signal(signal.SIGKILL)
            child.wait()
            output += read_to_end(child.stdout.fileno())
            errors = child.stderr.read().decode()
        assert child.returncode == -signal.SIGKILL, f"{where}: the child died by itself: {errors}"
        for line in output.decode("utf-8").splitlines(keepends=True):
            if line.endswith("\n") and line.startswith("ack "):
                acked.append(line[4:].strip())
        check_files(state_dir, where)
        # What a restarted daemon finds: every acknowledged update is pending, or was done
        # and is remembered; a redelivery of a forgotten one (a stranger's) is simply new.
        with Store.open(state_dir) as store:
            pending = {u["key"] for u in store.updates_pending("telegram")}
            lost = [k for k in acked if k not in pending and not _done(k)
                    and store.updates_accept("telegram", k, {}, 0.0)]
            assert not lost, f"{where}: acknowledged updates lost: {lost[:5]}"
    assert len(acked) >= 32, f"seed {seed}: too few acks to prove anything"


def _done(key: str) -> bool:
    """Whether the child marked `key` done and forgotten (then a redelivery counts as new)."""
    index = int(key.rsplit("-", 1)[1])
    return index % 4 == 2  # keys[::2] with i odd: index 2, 6, 10, ...


async def _roost(config: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "run", "--config", str(config), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)


def _resent(metrics: str) -> float:
    found = re.search(r'^roost_parts_resent_total\{channel="telegram"\} (\S+)$', metrics,
                      re.MULTILINE)
    assert found, metrics
    return float(found.group(1))


LONG = "\n\n".join(f"Part {i}. " + "word " * 700 for i in range(3))  # three Telegram parts


@pytest.mark.parametrize("in_flight", [0, 1], ids=["first-part", "second-part"])
async def test_a_part_in_flight_at_a_crash_is_sent_again_and_counted_in_metrics(
    fake_ollama: FakeOllama, fake_telegram: FakeTelegram, tmp_path: Path, in_flight: int
) -> None:
    # The crash child is roost itself, SIGKILLed while Telegram has its reply and has not
    # answered: whether the chat got it, roost cannot know, so it sends it again (at least
    # once) and counts the part as resent.
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "roost.toml"
    config.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlisten = "127.0.0.1:{port}"\n'
        f'[model]\nhost = "{fake_ollama.url}"\n'
        f'[telegram]\nenabled = true\nwebhook_url = "https://bot.example.org/webhooks/telegram"\n'
        f'api_base = "{fake_telegram.api_base}"\nfile_base = "{fake_telegram.file_base}"\n'
        f'allow = [1111111]\n'
        # Every part from the outbox: streamed, the finished parts would go out early, outside
        # the outbox's record of what is in flight that this test is about.
        f'streaming = "off"\n')
    env = {**os.environ, "ROOST_TELEGRAM_TOKEN": fake_telegram.token,
           "ROOST_TELEGRAM_SECRET": TG_SECRET}

    def update(update_id: int, text: str) -> dict[str, object]:
        return {"update_id": update_id, "message": {
            "message_id": update_id, "date": 1700000000, "text": text,
            "chat": {"id": 1111111, "type": "private", "first_name": "Test"},
            "from": {"id": 1111111, "is_bot": False, "first_name": "Test"}}}

    async def post(http: aiohttp.ClientSession, body: dict[str, object]) -> None:
        async with http.post(url + TG_WEBHOOK_PATH, json=body,
                             headers={TG_SECRET_HEADER: TG_SECRET}) as reply:
            assert reply.status == 200

    async def metrics(http: aiohttp.ClientSession) -> str:
        async with http.get(url + "/metrics") as reply:
            return await reply.text()

    fake_ollama.script(LONG)
    fake_telegram.hold("sendMessage", after=in_flight)  # parts before it go through
    daemon = await _roost(config, env)
    try:
        await fake_telegram.wait_for("setWebhook", timeout=60)
        async with aiohttp.ClientSession() as http:
            assert _resent(await metrics(http)) == 0
            await post(http, update(1, "hello"))
            await fake_telegram.wait_for("sendMessage", in_flight + 1, timeout=60)
    finally:
        daemon.kill()
        _, err = await daemon.communicate()
    assert daemon.returncode == -signal.SIGKILL, err.decode()[-3000:]
    fake_telegram.release()
    daemon = await _roost(config, env)
    try:
        sent = await fake_telegram.wait_for("sendMessage", 4, timeout=60)
        async with aiohttp.ClientSession() as http:
            for _ in range(100):  # the counter is bumped just before the record is written
                if _resent(await metrics(http)) == 1:
                    break
                await asyncio.sleep(0.05)
            assert _resent(await metrics(http)) == 1
            await post(http, update(2, "and again"))  # a reply no crash interrupted
            sent = await fake_telegram.wait_for("sendMessage", 5, timeout=60)
            assert _resent(await metrics(http)) == 1
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(daemon.communicate(), 60)
    assert daemon.returncode == 0, err.decode()[-3000:]
    # What the user saw: the part in flight twice (at least once), every other part once.
    seen = [c.params["text"].split(".")[0] for c in sent]
    parts = ["Part 0", "Part 1", "Part 2"]
    assert seen == [*parts[:in_flight + 1], *parts[in_flight:], "echo: and again"]

"""A full disk, for real: roost's state directory on a tiny tmpfs in a private mount namespace.

`unshare --user --map-root-user --mount` gives the daemon its own mount table, so the tmpfs
exists only for that process and disappears with it; nothing on the machine is touched. The
test fills it through /proc/<pid>/root, the daemon's view of the file system.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from channels.telegram.channel import SECRET_HEADER, WEBHOOK_PATH
from daemon.store import Store
from daemon.store.search_index import SearchIndex
from tests.daemon.app.test_app import free_port
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

SECRET = "s3cret_-X"
USER = 1111111


def _can_mount_private_tmpfs(tmp_path: Path) -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    result = subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", "sh", "-c",
         f"mount -t tmpfs -o size=64k tmpfs {probe}"], capture_output=True, timeout=30)
    return result.returncode == 0


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Path:
    if not _can_mount_private_tmpfs(tmp_path):
        pytest.skip("cannot mount a private tmpfs here (unshare or user namespaces missing)")
    state = tmp_path / "state"
    state.mkdir()
    return state


def _in_namespace(state: Path, size: str, fill: bool, command: list[str],
                  seed: Path | None = None) -> list[str]:
    script = f"mount -t tmpfs -o size={size},mode=0700 tmpfs {state} || exit 99\n"
    if seed is not None:  # the state of an earlier run, copied onto the tiny disk
        script += f"cp -a {seed}/. {state}/ || exit 98\n"
    if fill:
        script += f"cat /dev/zero > {state}/filler 2>/dev/null\n"
    script += 'exec "$@"\n'
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "roost",
            *command]


async def test_a_full_disk_at_start_exits_73_with_one_clear_line(
    tiny_disk: Path, tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tiny_disk}"\nlisten = "127.0.0.1:{free_port()}"\n'
                      f'[model]\nhost = "{fake_ollama.url}"\n')
    daemon = await asyncio.create_subprocess_exec(
        *_in_namespace(tiny_disk, "256k", True,
                       [sys.executable, "-m", "daemon", "run", "--config", str(config)]),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(daemon.communicate(), 60)
    assert daemon.returncode == 73, err.decode()
    lines = err.decode().splitlines()
    assert len(lines) == 1, lines
    assert "the disk is full" in lines[0] and "No space left on device" in lines[0]


def _update(update_id: int, text: str) -> dict[str, object]:
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": 1700000000, "text": text,
        "chat": {"id": USER, "type": "private", "first_name": "Test"},
        "from": {"id": USER, "is_bot": False, "first_name": "Test"}}}


def _fill(path: Path) -> None:
    with path.open("wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


async def test_a_disk_filling_up_while_running_gets_503_and_degraded_and_no_half_file(
    tiny_disk: Path, tmp_path: Path, fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "roost.toml"
    config.write_text(
        f'[daemon]\nstate_dir = "{tiny_disk}"\nlisten = "127.0.0.1:{port}"\n'
        f'[model]\nhost = "{fake_ollama.url}"\n'
        f'[telegram]\nenabled = true\nwebhook_url = "https://bot.example.org/webhooks/telegram"\n'
        f'api_base = "{fake_telegram.api_base}"\nfile_base = "{fake_telegram.file_base}"\n'
        f'allow = [{USER}]\n')
    env = {**os.environ, "ROOST_TELEGRAM_TOKEN": fake_telegram.token,
           "ROOST_TELEGRAM_SECRET": SECRET}
    daemon = await asyncio.create_subprocess_exec(
        *_in_namespace(tiny_disk, "8m", False,
                       [sys.executable, "-m", "daemon", "run", "--config", str(config)]),
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    seen = Path(f"/proc/{daemon.pid}/root") / str(tiny_disk).lstrip("/")
    headers = {SECRET_HEADER: SECRET}
    try:
        await fake_telegram.wait_for("setWebhook", timeout=30)
        fake_ollama.script("first answer")
        async with aiohttp.ClientSession() as http:
            async with http.post(url + WEBHOOK_PATH, json=_update(1, "hi"),
                                 headers=headers) as reply:
                assert reply.status == 200
            await fake_telegram.wait_for("sendMessage", timeout=30)
            await asyncio.to_thread(_fill, seen / "filler")
            async with http.post(url + WEBHOOK_PATH, json=_update(2, "while full"),
                                 headers=headers) as reply:
                assert reply.status == 503  # Telegram keeps it and sends it again
            for _ in range(300):
                async with http.get(url + "/healthz") as reply:
                    health = await reply.json()
                if health["status"] != "ok":
                    break
                await asyncio.sleep(0.1)
            assert health["status"] == "degraded" and "disk full" in health["reasons"]
            for path in seen.rglob("*.json"):  # every file whole: the old or the new bytes
                json.loads(path.read_bytes())
            assert list(seen.rglob("*.tmp")) == []
            (seen / "filler").unlink()
            fake_ollama.script("second answer")
            for _ in range(300):  # the next delivery after space is freed is taken
                async with http.post(url + WEBHOOK_PATH, json=_update(2, "while full"),
                                     headers=headers) as reply:
                    if reply.status == 200:
                        break
                await asyncio.sleep(0.1)
            assert reply.status == 200
            await fake_telegram.wait_for("sendMessage", 2, timeout=30)
    finally:
        if daemon.returncode is None:
            daemon.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(daemon.communicate(), 30)
    assert daemon.returncode == 0, err.decode()[-3000:]
    assert b"Traceback" not in err, err.decode()[-3000:]


@pytest.mark.parametrize("with_index", [True, False], ids=["index-kept", "index-deleted"])
async def test_a_full_disk_at_start_with_existing_state_exits_73_with_one_clear_line(
    tiny_disk: Path, tmp_path: Path, fake_ollama: FakeOllama, with_index: bool
) -> None:
    # State from an earlier run (the store and its memory index), then the disk fills up while
    # roost is down: the memory index, derived data, must not turn that into a traceback.
    seed = tmp_path / "seed"
    seed.mkdir(mode=0o700)
    Store.open(seed).close()
    index = SearchIndex.open(seed / "memory.sqlite3")
    index.close()
    if not with_index:
        for leftover in seed.glob("memory.sqlite3*"):
            leftover.unlink()
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tiny_disk}"\nlisten = "127.0.0.1:{free_port()}"\n'
                      f'[model]\nhost = "{fake_ollama.url}"\n')
    daemon = await asyncio.create_subprocess_exec(
        *_in_namespace(tiny_disk, "2m", True,
                       [sys.executable, "-m", "daemon", "run", "--config", str(config)],
                       seed=seed),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(daemon.communicate(), 60)
    assert daemon.returncode == 73, err.decode()
    lines = err.decode().splitlines()
    assert len(lines) == 1, lines
    assert "the disk is full" in lines[0] and "No space left on device" in lines[0]

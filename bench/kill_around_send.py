"""Duplicates after a SIGKILL around a send: how many replies a restarted roost sends twice.

    python bench/kill_around_send.py [--channel telegram|whatsapp|both] [--delays 0,0.5,1,2,5]
                                     [--repeats 2] [--tree PATH] [--timeout 600]

For each delay and repeat: `roost run` (a child process, fresh state) gets one message, the fake
platform takes the reply, and the child is killed with SIGKILL that many milliseconds after the
send reached the fake; a second `roost run` on the same state finishes what was left, and the
reply is counted at the fake: more than once is a duplicate. The fakes are the test suite's
(tests/fakes, loopback only); the fake Graph API posts each send's `sent` and `delivered`
statuses to roost's webhook, retrying while roost is down, as Meta does.

`--tree PATH` runs the daemon from another checkout of roost (e.g. `git worktree add
/tmp/before <commit>`), for a before/after comparison on the same machine and load; the fakes
and this script stay this checkout's. Bounded: at most `--timeout` seconds in all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from channels.telegram.channel import SECRET_HEADER, WEBHOOK_PATH
from daemon.store import Store
from tests.fakes.graph import PHONE_NUMBER_ID, FakeGraph, sign, text_message, webhook
from tests.fakes.ollama import FakeOllama, echo_reply
from tests.fakes.telegram import FakeTelegram

USER = 1111111
WA_USER = "972544401243"
SECRET = "kill-bench-secret"
APP_SECRET = "kill-bench-app-secret"
WA_HOOK = "/webhooks/whatsapp"


@dataclass
class Fakes:
    ollama: FakeOllama
    telegram: FakeTelegram
    graph: FakeGraph


def config(state: Path, port: int, fakes: Fakes, channel: str) -> tuple[Path, dict[str, str]]:
    """roost.toml for one trial, and the environment with the channel's secrets."""
    text = (f'[daemon]\nstate_dir = "{state}"\nlisten = "127.0.0.1:{port}"\n'
            f'shutdown_grace = "2s"\n\n[model]\nhost = "{fakes.ollama.url}"\n'
            f'retry_backoff = "50ms"\n\n')
    env = dict(os.environ)
    if channel == "telegram":
        text += (f'[telegram]\nenabled = true\nmode = "webhook"\n'
                 f'webhook_url = "https://bot.example.org{WEBHOOK_PATH}"\n'
                 f'api_base = "{fakes.telegram.api_base}"\n'
                 f'file_base = "{fakes.telegram.file_base}"\nallow = [{USER}]\n')
        env |= {"ROOST_TELEGRAM_TOKEN": fakes.telegram.token, "ROOST_TELEGRAM_SECRET": SECRET}
    else:
        text += (f'[whatsapp]\nenabled = true\nphone_number_id = "{PHONE_NUMBER_ID}"\n'
                 f'api_base = "{fakes.graph.url}"\nallow = ["{WA_USER}"]\n')
        env |= {"ROOST_WHATSAPP_TOKEN": fakes.graph.token,
                "ROOST_WHATSAPP_APP_SECRET": APP_SECRET, "ROOST_WHATSAPP_VERIFY_TOKEN": "v"}
    path = state.parent / "roost.toml"
    path.write_text(text)
    return path, env


async def start_daemon(path: Path, env: dict[str, str], url: str,
                       tree: Path) -> asyncio.subprocess.Process:
    env = env | {"PYTHONPATH": str(tree)}
    log = path.parent / "roost.log"  # its journal, for when it does not come up
    with log.open("ab") as err:
        daemon = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "daemon", "run", "--config", str(path), env=env, cwd=tree,
            stdout=asyncio.subprocess.DEVNULL, stderr=err)
    async with asyncio.timeout(60), aiohttp.ClientSession() as http:
        while daemon.returncode is None:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{url}/healthz") as reply:
                    if reply.status == 200:
                        return daemon
            await asyncio.sleep(0.05)
    raise RuntimeError(f"roost did not come up: {log.read_text()[-2000:]}")


async def post(channel: str, url: str, n: int) -> None:
    if channel == "telegram":
        update = {"update_id": 1000 + n, "message": {
            "message_id": 10 + n, "date": int(time.time()), "text": f"trial {n}",
            "chat": {"id": USER, "type": "private", "first_name": "B"},
            "from": {"id": USER, "is_bot": False, "first_name": "B"}}}
        body = json.dumps(update).encode()
        headers = {"Content-Type": "application/json", SECRET_HEADER: SECRET}
        target = url + WEBHOOK_PATH
    else:
        body = webhook(text_message(f"wamid.trial{n}", WA_USER, f"trial {n}"))
        headers = {"Content-Type": "application/json",
                   "X-Hub-Signature-256": sign(APP_SECRET, body)}
        target = url + WA_HOOK
    async with aiohttp.ClientSession() as http, http.post(target, data=body,
                                                          headers=headers) as reply:
        assert reply.status == 200, reply.status


def sends(fakes: Fakes, channel: str, n: int) -> int:
    """How many times the reply of trial `n` reached the fake platform."""
    if channel == "telegram":
        return sum(1 for m in fakes.telegram.sent_messages if m["text"] == f"echo: trial {n}")
    return fakes.graph.texts(WA_USER).count(f"echo: trial {n}")


def nothing_left(state: Path) -> bool:
    with Store.open(state, read_only=True) as store:
        return store.inbox_pending() == [] and store.outbox_pending() == []


async def trial(fakes: Fakes, channel: str, n: int, delay_ms: float, tree: Path,
                port: int) -> int:
    """One kill `delay_ms` after the send reached the fake, a restart; the reply's count."""
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder) / "state"
        path, env = config(state, port, fakes, channel)
        if channel == "whatsapp":
            fakes.graph.statuses_to(url + WA_HOOK, APP_SECRET)
        first = await start_daemon(path, env, url, tree)
        try:
            before = len(fakes.telegram.calls_to("sendMessage")) if channel == "telegram" \
                else len(fakes.graph.calls_of("send"))
            await post(channel, url, n)
            if channel == "telegram":
                await fakes.telegram.wait_for("sendMessage", before + 1, timeout=30)
            else:
                await fakes.graph.wait_for("send", before + 1, timeout=30)
            await asyncio.sleep(delay_ms / 1000)
            first.send_signal(signal.SIGKILL)
        finally:
            with contextlib.suppress(ProcessLookupError):
                first.kill()
            await first.wait()
        second = await start_daemon(path, env, url, tree)
        try:
            async with asyncio.timeout(90):  # a part in doubt waits up to 30 s for its status
                while not await asyncio.to_thread(nothing_left, state):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
        finally:
            second.send_signal(signal.SIGTERM)
            await second.wait()
    return sends(fakes, channel, n)


async def run(args: argparse.Namespace) -> None:
    delays = [float(d) for d in args.delays.split(",")]
    channels = ["telegram", "whatsapp"] if args.channel == "both" else [args.channel]
    deadline = time.monotonic() + args.timeout
    async with FakeOllama() as ollama, FakeTelegram() as telegram, FakeGraph() as graph:
        ollama.default_reply = echo_reply
        telegram.start_chat(USER)  # the user wrote to the bot before: it may answer
        fakes = Fakes(ollama, telegram, graph)
        with socket.socket() as sock:  # one port for every daemon: roost's webhook URL
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        n = 0
        print(f"daemon from {args.tree}")
        for channel in channels:
            for delay in delays:
                counts = []
                for _ in range(args.repeats):
                    if time.monotonic() > deadline:
                        print("time is up")
                        return
                    n += 1
                    counts.append(await trial(fakes, channel, n, delay, args.tree, port))
                twice = sum(1 for c in counts if c > 1)
                lost = sum(1 for c in counts if c == 0)
                print(f"{channel:<9} kill {delay:4.1f} ms after the send: "
                      f"{twice} of {len(counts)} replies duplicated, {lost} lost")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channel", choices=["telegram", "whatsapp", "both"], default="both")
    parser.add_argument("--delays", default="0,0.5,1,2,5", help="milliseconds, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds in all")
    args = parser.parse_args()
    args.repeats = max(1, min(args.repeats, 50))
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

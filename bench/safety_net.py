"""The in-turn safety net on a long tool turn, and model reloads over a /model switch.

    python bench/safety_net.py [--turns 300] [--baseline 626260d]

Both parts run the real engine (store, model client, turn, tool loop, background folds) against
the loopback fake Ollama, once on this tree and once on the baseline commit (exported with
`git archive` to a temporary directory and run there in a child process), and print the figures
side by side with their ratios.

1. The 30 KB-pages turn (issue 29): an 8,192 window, `model.max_calls` 8; the model fetches one
   30 KB page per call until a call comes without tools (the last one), then answers. Figures:
   pages read, safety-net passes (state calls), model calls, the largest request against the
   window less the reply's reserve (tokens by `FakeOllama.count_tokens`).
2. A sawtooth of `--turns` turns (~300-token messages, ~150-token answers) at a 4,096 and an
   8,192 window, the chat switched with `/model small:1b` halfway; every turn waits for its
   background folds. On one GPU a request for another model, or the same one at another
   `num_ctx`, reloads it: the figure is every such change between consecutive requests less
   the one the user asked for (goal 0), and the fake's own count of `num_ctx` reloads.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = 30_000
CHAT = "console:local"
DEFAULT, SMALL = "qwen3:4b", "small:1b"


def page(n: int) -> str:
    return (f"Page {n} line with facts. " * 1300)[:PAGE]


async def pages_turn() -> dict[str, Any]:
    """Part 1 on whatever tree is first on sys.path."""
    from daemon.context.compact import STATE_REQUEST
    from daemon.tools.registry import Capability, Tool
    from tests.fakes.ollama import FakeModel, FakeOllama, Reply

    fetched = iter(range(1, 1000))

    def model(body: dict[str, Any]) -> Reply:
        if STATE_REQUEST in str(body["messages"][-1].get("content")):
            return Reply(content="TASK: read pages\nPROGRESS: some\nREMAINING: more\nDATA: "
                                 "facts\nDECISIONS: none")
        if not body.get("tools"):
            return Reply(content="Here is what the pages say.")
        return Reply(tool_calls=[{"function": {"name": "fetch_page",
                                               "arguments": {"n": next(fetched)}}}])

    async def fetch_page(context: object, n: int) -> str:
        return page(n)

    pages = Capability(name="pages", core=True, description="fetch pages", tools=(Tool(
        "fetch_page", "Fetch page n.",
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        fetch_page),))
    async with FakeOllama(models=[FakeModel(name=DEFAULT, context_length=32768)]) as fake:
        fake.default_reply = model
        async with running(fake, 8192, (pages,)) as (engine, say):
            await say("Read the pages one by one and tell me what they say.")
            conversation = engine.store.active_conversation(CHAT)
            assert conversation is not None
            read = sum(m.role == "tool" for m in engine.store.messages(conversation.id))
        bodies = fake.chat_requests
        return {"pages read": read,
                "safety-net passes": sum(STATE_REQUEST in str(b["messages"][-1].get("content"))
                                         for b in bodies),
                "model calls": len(bodies),
                "largest request": max(fake.count_tokens(b["messages"], b.get("tools"))
                                       for b in bodies),
                "window less reserve": 8192 - 1024}


async def sawtooth(window: int, turns: int) -> dict[str, Any]:
    """Part 2 at one window on whatever tree is first on sys.path."""
    from daemon.context.compact import STATE_REQUEST
    from daemon.context.fold import FOLD_SYSTEM
    from tests.fakes.ollama import FakeModel, FakeOllama, Reply

    def model(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        if str(messages[0].get("content") or "").startswith(FOLD_SYSTEM):
            return Reply(content="The user and the assistant chatted about numbered topics; "
                                 "nothing is pending. " * 6)
        if STATE_REQUEST in str(messages[-1].get("content")):
            return Reply(content="TASK: chat\nPROGRESS: -\nREMAINING: -\nDATA: -\nDECISIONS: -")
        return Reply(content="Noted, and here is a considered answer about it. " * 12)

    models = [FakeModel(name=DEFAULT, context_length=32768),
              FakeModel(name=SMALL, context_length=32768)]
    async with FakeOllama(models=models) as fake:
        fake.default_reply = model
        async with running(fake, window, ()) as (_, say):
            for turn in range(turns):
                if turn == turns // 2:
                    await say(f"/model {SMALL}")
                await say(f"Message {turn}: " + "a few words about this and that " * 37)
        loads = [(b.get("model"), (b.get("options") or {}).get("num_ctx"))
                 for b in (r.body for r in fake.requests if r.path == "/api/chat")
                 if isinstance(b, dict)]
        changes = sum(a != b for a, b in itertools.pairwise(loads))
        bodies = fake.chat_requests
        switched = next((i for i, b in enumerate(bodies) if b.get("model") == SMALL),
                        len(bodies))
        folds = [i for i, b in enumerate(bodies)
                 if str(b["messages"][0].get("content") or "").startswith(FOLD_SYSTEM)]
        return {"reloads by roost": max(0, changes - 1), "num_ctx reloads (fake)": fake.reloads,
                "folds": len(folds),
                "folds to the default model after the switch": sum(
                    i > switched and bodies[i].get("model") == DEFAULT for i in folds),
                "requests over the window": sum(
                    fake.count_tokens(b["messages"], b.get("tools")) > window
                    for b in fake.chat_requests),
                "cut by Ollama": fake.cuts}


class running:
    """An engine on a fresh state directory, and `say(text)`: one message, answered, its
    background folds landed."""

    def __init__(self, fake: Any, window: int, capabilities: tuple[Any, ...]) -> None:
        self.fake, self.window, self.capabilities = fake, window, capabilities
        self.folder = tempfile.TemporaryDirectory()

    async def __aenter__(self) -> tuple[Any, Callable[[str], Any]]:
        import dataclasses

        from daemon.core.config import Settings
        from daemon.core.messages import Inbound
        from daemon.llm.client import ModelClient
        from daemon.store import Store
        from tests.conftest import RecordingChannel

        base = Settings.defaults(env={"STATE_DIRECTORY": self.folder.name})
        settings = dataclasses.replace(base, model=dataclasses.replace(
            base.model, host=self.fake.url, name=DEFAULT, window=self.window,
            retry_backoff=0.01))
        self.store = Store.open(Path(self.folder.name))
        self.llm = ModelClient(settings.model)
        channels = {"console": RecordingChannel()}
        try:
            from daemon.app.assembly import assemble
        except ImportError:  # the baseline tree, from before the one assembly
            from daemon.engine.workers import Engine
            self.engine = Engine(settings=settings, store=self.store, llm=self.llm,
                                 channels=channels)
        else:
            self.engine = assemble(settings, self.store, self.llm, channels).engine
        for capability in self.capabilities:
            self.engine.parts.registry.register(capability)
        await self.engine.start()
        engine = self.engine

        async def say(text: str) -> None:
            assert await engine.submit(Inbound(chat_key=CHAT, text=text, received=time.time()))
            await asyncio.wait_for(engine.wait_idle(CHAT), 120)
            conversation = engine.store.active_conversation(CHAT)
            if conversation is not None:
                while True:  # a landed fold may schedule the next batch
                    await engine.parts.folder.wait(conversation.id)
                    await asyncio.sleep(0)
                    if not engine.parts.folder.busy(conversation.id):
                        break
        return engine, say

    async def __aexit__(self, *exc: object) -> None:
        await self.engine.stop(grace=0)
        await self.llm.close()
        self.store.close()
        self.folder.cleanup()


async def measure(turns: int) -> dict[str, Any]:
    return {"pages turn": await pages_turn(),
            "sawtooth 4K": await sawtooth(4096, turns),
            "sawtooth 8K": await sawtooth(8192, turns)}


def baseline(commit: str, turns: int) -> dict[str, Any]:
    """The same measurements on `commit`'s tree, in a child process."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True,
                             capture_output=True).stdout
    with tempfile.TemporaryDirectory() as tree:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
        done = subprocess.run([sys.executable, __file__, "--tree", tree, "--turns", str(turns),
                               "--json"], check=True, capture_output=True, text=True, cwd=tree)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def ratio(now: float, then: float) -> str:
    return f"{now / then:.2f}x" if then else ("=" if now == then else "n/a (baseline 0)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--baseline", default="626260d")
    parser.add_argument("--tree", help=argparse.SUPPRESS)  # the child: measure this tree
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, args.tree or str(ROOT))  # `tests` is not installed
    if args.json:
        print(json.dumps(asyncio.run(measure(args.turns))))
        return
    then = baseline(args.baseline, args.turns)
    now = asyncio.run(measure(args.turns))
    print(f"{'':47} {'this tree':>10} {args.baseline:>10}  ratio")
    for part, figures in now.items():
        print(part)
        for name, value in figures.items():
            old = then.get(part, {}).get(name, 0)
            print(f"  {name:45} {value:>10} {old:>10}  {ratio(value, old)}")


if __name__ == "__main__":
    main()

"""From a fresh clone to the first Telegram reply, scripted, as a new owner would go (issue 20).

    python bench/first_reply.py            # from the repository root, with the test extra
    python bench/first_reply.py --keep     # keep the temporary folder to look at

Steps, each timed: `git clone` of this checkout (its committed HEAD) into a temporary folder;
`python3 -m venv .venv && .venv/bin/pip install .` there (the README's Quick start; pip's cache
is warm on a machine that installed roost before); `roost init --non-interactive` against the
test suite's loopback fakes of Ollama and the Bot API, which run in this process (the owner's
/start is waiting at the fake, so init pairs them at once); `roost run` in polling mode until
the owner's first message is answered. Nothing leaves the machine: every address is 127.0.0.1.

Printed: each step's wall time, the total against the goal (2 minutes), and pip's share of it.
The baseline of the same run is `python3 -m venv` alone (the floor of any install).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `tests` (the fakes) is not installed

from tests.fakes.ollama import FakeOllama  # noqa: E402
from tests.fakes.telegram import FakeTelegram  # noqa: E402

OWNER = 4242424
GOAL = 120.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def message(text: str) -> dict[str, object]:
    return {"message": {"message_id": int(time.time() * 1000) % 1_000_000, "date": int(time.time()),
                        "chat": {"id": OWNER, "type": "private", "first_name": "Owner"},
                        "from": {"id": OWNER, "is_bot": False, "first_name": "Owner"},
                        "text": text}}


async def timed(label: str, times: dict[str, float], *argv: str, env: dict[str, str] | None = None,
                cwd: Path | None = None) -> None:
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(process.communicate(), 600)
    times[label] = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"{label} failed ({process.returncode}):\n{out.decode()[-3000:]}")


async def bench(folder: Path) -> dict[str, float]:
    times: dict[str, float] = {}
    clone = folder / "roost"
    await timed("venv alone (baseline)", times, sys.executable, "-m", "venv",
                str(folder / "baseline-venv"))
    await timed("git clone", times, "git", "clone", "--quiet", str(ROOT), str(clone))
    await timed("venv + pip install .", times, "sh", "-c",
                "python3 -m venv .venv && .venv/bin/pip install --quiet .", cwd=clone)
    home = folder / "home"
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", ""),
           "XDG_CONFIG_HOME": str(home / ".config"), "XDG_STATE_HOME": str(home / ".state")}
    config = home / ".config" / "roost" / "roost.toml"
    credentials = home / ".config" / "roost" / "credentials"
    roost = str(clone / ".venv" / "bin" / "roost")
    async with FakeOllama() as ollama, FakeTelegram(bot_username="my_roost_bot") as telegram:
        telegram.queue_update(message("/start"))  # the owner, as init asks
        await timed("roost init --non-interactive", times, roost, "init", "--non-interactive",
                    "--ollama-url", ollama.url, "--telegram-api-base", telegram.api_base,
                    "--config", str(config), "--credentials-dir", str(credentials),
                    "--no-service", "--pair-timeout", "60",
                    env={**env, "ROOST_TELEGRAM_TOKEN": telegram.token})
        # The bench's own port, so that it never meets a roost already on 8780.
        with config.open("a") as text:
            text.write(f'\n[daemon]\nlisten = "127.0.0.1:{free_port()}"\n')
        started = time.perf_counter()
        log = (folder / "roost-run.log").open("wb")
        daemon = await asyncio.create_subprocess_exec(
            roost, "run", "--config", str(config),
            env={**env, "CREDENTIALS_DIRECTORY": str(credentials)},
            stdout=asyncio.subprocess.DEVNULL, stderr=log)
        try:
            telegram.queue_update(message("hello from my phone"))
            sent = len(telegram.calls_to("sendMessage"))  # init's "you are paired"
            while not any("echo: hello from my phone" in str(m.get("text"))
                          for m in telegram.sent_messages):
                sent += 1
                try:
                    await telegram.wait_for("sendMessage", sent, timeout=30)
                except TimeoutError:
                    raise SystemExit("no reply within 120 s; roost run's log:\n"
                                     + (folder / "roost-run.log").read_text()[-3000:]) from None
            times["roost run to the first reply"] = time.perf_counter() - started
        finally:
            daemon.send_signal(signal.SIGTERM)
            await asyncio.wait_for(daemon.wait(), 60)
            log.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    keep = parser.parse_args().keep
    folder = Path(tempfile.mkdtemp(prefix="roost-first-reply-"))
    try:
        times = asyncio.run(bench(folder))
    finally:
        if keep:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    baseline = times.pop("venv alone (baseline)")
    total = sum(times.values())
    for label, seconds in times.items():
        print(f"{label:<32} {seconds:7.1f} s")
    pip = times["venv + pip install ."]
    print(f"{'total, clone to first reply':<32} {total:7.1f} s  "
          f"({'within' if total <= GOAL else 'OVER'} the {GOAL:.0f} s goal: x{total / GOAL:.2f})")
    print(f"pip's share: {pip / total:.0%} (venv alone: {baseline:.1f} s; pip install is "
          f"x{pip / baseline:.1f} that)")
    print(f"without pip: {total - pip:.1f} s")


if __name__ == "__main__":
    main()

"""Whether roost keeps answering while strangers hold connections with a whole request head
and no body (issue 17, item 3). Every figure comes with its no-attack baseline from the run.

    python bench/slow_body.py                        # 600 connections, 10 s baseline, 15 s attack
    python bench/slow_body.py --connections 300 --attack-seconds 8 --addresses 4
    python bench/slow_body.py --attack idle        # kept-alive silent connections instead

roost runs as in production: `python -m daemon run` in a child process (its own HTTP server,
GuardedSite with its default limits, 1,024 file descriptors as a service gets without
LimitNOFILE), with Telegram (webhook mode) and WhatsApp on, against the test suite's loopback
fakes of Ollama, the Bot API and the Graph API in this process.

* **baseline**: every `--interval` seconds three probes, each on a new connection:
  `GET /healthz`, a Telegram update with the right secret, a signed WhatsApp message (each from
  an allowed sender, so each is stored and answered). A probe is answered when an HTTP status
  comes back within `--probe-timeout` seconds.
* **attack**: `--connections` connections from `--addresses` loopback addresses (127.0.0.2 and
  up; the probes come from 127.0.0.1) each send `POST /webhooks/telegram` with
  `Content-Length: 1000`, no secret and no body, then nothing; each one roost closes is opened
  again at once, for `--attack-seconds` (and at most `--max-opens` connections in all). The
  same probes run throughout. `--attack idle`: each connection sends a whole `GET /healthz`,
  reads the answer and then keeps the connection open and silent (kept alive).

Printed: the probes answered in each phase and their ratio, probe latency, and what the attack
did (connections opened, closed by roost, refused).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from channels.telegram.channel import SECRET_HEADER, WEBHOOK_PATH
from channels.whatsapp.channel import WEBHOOK_PATH as WA_WEBHOOK_PATH
from tests.fakes.graph import API_VERSION, PHONE_NUMBER_ID, FakeGraph, sign, text_message, webhook
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

SECRET = "bench-secret"
APP_SECRET = "bench-app-secret"
USER = 3_000_001
WA_USER = "972500000001"
ANNOUNCED = 1000  # bytes of body each attacking head announces, and never sends
ROOT = Path(__file__).resolve().parent.parent


def attack_head(port: int, kind: str) -> bytes:
    """`body`: a head announcing a body that never comes; `idle`: a whole request, and then
    the connection kept open and silent (kept alive, as a client may)."""
    if kind == "idle":
        return f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    return (f"POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {ANNOUNCED}\r\n\r\n").encode()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def child_limits() -> None:  # in the child: the 1,024 descriptors of a service without LimitNOFILE
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(
        resource.RLIMIT_NOFILE)[1]))


def raise_own_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# ---- probes ----------------------------------------------------------------------------------


@dataclass
class Probes:
    """Probes sent and answered in one phase, by kind."""

    sent: dict[str, int] = field(default_factory=dict)
    answered: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)  # why a probe was not answered

    def note(self, kind: str, answered: bool, latency: float, why: str = "") -> None:
        self.sent[kind] = self.sent.get(kind, 0) + 1
        if why:
            self.failures[why] = self.failures.get(why, 0) + 1
        if answered:
            self.answered[kind] = self.answered.get(kind, 0) + 1
            self.latencies.append(latency)

    @property
    def share(self) -> float:
        sent = sum(self.sent.values())
        return sum(self.answered.values()) / sent if sent else 0.0

    def line(self, name: str) -> str:
        kinds = "  ".join(f"{kind} {self.answered.get(kind, 0)}/{n}"
                          for kind, n in self.sent.items())
        total = f"{sum(self.answered.values())}/{sum(self.sent.values())}"
        if self.latencies:
            ordered = sorted(self.latencies)
            p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
            timing = (f"  latency p50 {statistics.median(ordered) * 1000:7.1f} ms  "
                      f"p99 {p99 * 1000:7.1f} ms")
        else:
            timing = ""
        failed = f"  not answered: {self.failures}" if self.failures else ""
        return f"  {name:<8} answered {total:>7} ({self.share:6.1%})  {kinds}{timing}{failed}"


class Prober:
    """The three probes, each on a new connection from 127.0.0.1."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.timeout = timeout
        self.next_id = 1

    async def round(self, into: Probes) -> None:
        update_id, self.next_id = self.next_id, self.next_id + 1
        update = {"update_id": update_id, "message": {
            "message_id": update_id, "date": int(time.time()), "text": f"probe {update_id}",
            "chat": {"id": USER, "type": "private", "first_name": "Probe"},
            "from": {"id": USER, "is_bot": False, "first_name": "Probe"}}}
        wa_body = webhook(text_message(f"wamid.probe{update_id}", WA_USER, f"probe {update_id}"))
        await asyncio.gather(
            self._one(into, "healthz", "GET", "/healthz", None, {}),
            self._one(into, "telegram", "POST", WEBHOOK_PATH, json.dumps(update).encode(),
                      {"Content-Type": "application/json", SECRET_HEADER: SECRET}),
            self._one(into, "whatsapp", "POST", WA_WEBHOOK_PATH, wa_body,
                      {"Content-Type": "application/json",
                       "X-Hub-Signature-256": sign(APP_SECRET, wa_body)}))

    async def _one(self, into: Probes, kind: str, method: str, path: str, body: bytes | None,
                   headers: dict[str, str]) -> None:
        connector = aiohttp.TCPConnector(force_close=True, local_addr=("127.0.0.1", 0))
        started = time.perf_counter()
        answered, why = False, ""
        try:
            async with aiohttp.ClientSession(
                    connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout)
            ) as http, http.request(method, self.url + path, data=body,
                                    headers=headers) as reply:
                await reply.read()
                answered = reply.status < 500
                why = "" if answered else f"HTTP {reply.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            why = type(exc).__name__
        into.note(kind, answered, time.perf_counter() - started, why)


async def probe_for(prober: Prober, seconds: float, interval: float) -> Probes:
    probes = Probes()
    rounds: list[asyncio.Task[None]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rounds.append(asyncio.create_task(prober.round(probes)))
        await asyncio.sleep(interval)
    await asyncio.gather(*rounds)
    return probes


# ---- the attack ------------------------------------------------------------------------------


@dataclass
class Attack:
    opened: int = 0
    closed_by_roost: int = 0
    refused: int = 0  # a connect that failed, or a connection reset while the head went out
    max_opens: int = 20_000


async def hold(host: str, port: int, local: str, until: float, attack: Attack,
               kind: str) -> None:
    """One attacking slot: a connection held until roost closes it, then another."""
    head = attack_head(port, kind)
    while time.monotonic() < until and attack.opened < attack.max_opens:
        attack.opened += 1
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(local, 0))
            writer.write(head)
            await writer.drain()
            left = until - time.monotonic()
            if left <= 0:
                break
            async with asyncio.timeout(left):
                await reader.read()  # b"" (or an answer) once roost closes it
            attack.closed_by_roost += 1
        except TimeoutError:
            break  # held to the end of the attack
        except OSError:
            attack.refused += 1
            await asyncio.sleep(0.05)
        finally:
            if writer is not None:
                writer.close()


# ---- the run ---------------------------------------------------------------------------------


def config_text(state_dir: Path, port: int, ollama: FakeOllama, telegram: FakeTelegram,
                graph: FakeGraph) -> str:
    return (f'[daemon]\nstate_dir = "{state_dir}"\nlisten = "127.0.0.1:{port}"\n'
            f'[model]\nhost = "{ollama.url}"\n'
            # Pacing out of reach: the probes are one sender each, faster than a person.
            '[access]\nrate_limit = 100000\n'
            '[telegram]\nenabled = true\nmode = "webhook"\n'
            'webhook_url = "https://bot.example.org/webhooks/telegram"\n'
            f'api_base = "{telegram.api_base}"\nfile_base = "{telegram.file_base}"\n'
            f'allow = [{USER}]\n'
            f'[whatsapp]\nenabled = true\nphone_number_id = "{PHONE_NUMBER_ID}"\n'
            f'api_base = "{graph.url}"\napi_version = "{API_VERSION}"\nallow = ["{WA_USER}"]\n')


def count_tracebacks(log: Path, keep: str | None) -> int:
    logged = log.read_text(errors="replace")
    if keep:
        Path(keep).write_text(logged)
    return logged.count("Traceback")


async def wait_until_up(url: str, within: float) -> None:
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + within
        while True:
            try:
                async with http.get(url + "/healthz") as reply:
                    if reply.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.1)


async def run(args: argparse.Namespace) -> int:
    raise_own_limit(args.connections + 1024)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="roost-slow-body-") as tmp:
        state = Path(tmp) / "state"
        state.mkdir(mode=0o700)
        async with FakeOllama() as ollama, FakeTelegram(started=[USER]) as telegram, \
                FakeGraph() as graph:
            config = Path(tmp) / "roost.toml"
            config.write_text(config_text(state, port, ollama, telegram, graph))
            env = {**os.environ, "ROOST_TELEGRAM_TOKEN": telegram.token,
                   "ROOST_TELEGRAM_SECRET": SECRET, "ROOST_WHATSAPP_TOKEN": graph.token,
                   "ROOST_WHATSAPP_APP_SECRET": APP_SECRET,
                   "ROOST_WHATSAPP_VERIFY_TOKEN": "bench-verify"}
            log = (Path(tmp) / "roost.log").open("wb")
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "daemon", "run", "--config", str(config), env=env,
                cwd=ROOT, stdout=asyncio.subprocess.DEVNULL,
                stderr=log, preexec_fn=child_limits)
            try:
                await wait_until_up(url, 120)
                prober = Prober(url, args.probe_timeout)
                baseline = await probe_for(prober, args.baseline_seconds, args.interval)
                attack = Attack(max_opens=args.max_opens)
                until = time.monotonic() + args.attack_seconds
                callers = [f"127.0.0.{2 + i % args.addresses}" for i in range(args.connections)]
                slots = [asyncio.create_task(hold("127.0.0.1", port, caller, until, attack,
                                              args.attack))
                         for caller in callers]
                await asyncio.sleep(min(1.0, args.attack_seconds / 4))  # the attack in place
                under = await probe_for(prober, until - time.monotonic(), args.interval)
                await asyncio.gather(*slots)
                alive = child.returncode is None
            finally:
                if child.returncode is None:
                    child.terminate()
                try:
                    await asyncio.wait_for(child.wait(), 60)
                except TimeoutError:
                    child.kill()
                    await child.wait()
                log.close()
            tracebacks = await asyncio.to_thread(count_tracebacks, Path(tmp) / "roost.log",
                                                 args.log)
    what = (f"a POST head announcing {ANNOUNCED} bytes and no body" if args.attack == "body"
            else "a whole GET /healthz and then silence")
    print(f"{args.attack} attack: {args.connections} connections from {args.addresses} "
          f"address(es), each {what}, reopened when closed, for {args.attack_seconds:.0f} s; "
          f"probes every {args.interval} s")
    print(baseline.line("baseline"))
    print(under.line("attack"))
    ratio = under.share / baseline.share if baseline.share else float("nan")
    print(f"  answered under attack / baseline: {ratio:.2f}x")
    state = "still running" if alive else "DIED"
    print(f"  attack: {attack.opened} connections opened, {attack.closed_by_roost} closed by "
          f"roost, {attack.refused} refused or reset; roost {state}, "
          f"{tracebacks} tracebacks in its log")
    return 0 if alive else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=600)
    parser.add_argument("--addresses", type=int, default=1,
                        help="loopback addresses the attack comes from (127.0.0.2 and up)")
    parser.add_argument("--baseline-seconds", type=float, default=10.0)
    parser.add_argument("--attack-seconds", type=float, default=15.0)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--probe-timeout", type=float, default=5.0)
    parser.add_argument("--max-opens", type=int, default=50_000,
                        help="connections the attack opens in all, at most")
    parser.add_argument("--attack", choices=("body", "idle"), default="body",
                        help="heads without bodies (default), or kept-alive idle connections")
    parser.add_argument("--log", help="keep roost's log (stderr) in this file")
    args = parser.parse_args(argv)
    if not 1 <= args.addresses <= 250 or args.connections < 1:
        parser.error("--addresses must be 1..250 and --connections at least 1")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())

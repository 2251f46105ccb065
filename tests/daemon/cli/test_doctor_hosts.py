"""`roost doctor` with several Ollama hosts (`[model] hosts`): a line for each host (reachable,
its version, which configured models it has, what it has loaded and the GPU memory it takes), a
FAIL for a host that is down, and, when no host has the chat model, a FAIL naming each host
with the `ollama pull` line."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.daemon.cli.test_doctor import doctor, failed
from tests.fakes.ollama import VERSION, FakeModel, FakeOllama

DIGEST = "llama3.2:3b"  # an automation's own model


@pytest.fixture
async def hosts() -> AsyncIterator[tuple[FakeOllama, FakeOllama, FakeOllama]]:
    async with FakeOllama() as a, FakeOllama([FakeModel(), FakeModel(DIGEST)]) as b, \
            FakeOllama() as c:
        yield a, b, c


def write_config(tmp_path: Path, hosts: str, automation: bool = False) -> Path:
    config = tmp_path / "roost.toml"
    text = f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[model]\n{hosts}\n'
    if automation:
        text += (f'[[automations]]\nname = "digest"\nschedule = "0 7 * * *"\nprompt = "News?"\n'
                 f'model = "{DIGEST}"\ndeliver = ["log"]\n')
    config.write_text(text)
    return config


def lines_of(out: str, prefix: str) -> list[str]:
    return [line for line in out.splitlines() if line[5:].startswith(prefix)]


async def test_each_host_has_its_line_and_one_that_is_down_fails(
    tmp_path: Path, hosts: tuple[FakeOllama, FakeOllama, FakeOllama],
) -> None:
    a, b, c = hosts
    a.loaded["qwen3:4b"] = 8192  # a chat ran there a moment ago
    await c.refuse_connections()  # the evening box is off
    config = write_config(tmp_path, f'[[model.hosts]]\nurl = "{a.url}"\npriority = 10\n'
                          f'[[model.hosts]]\nurl = "{b.url}"\n[[model.hosts]]\nurl = "{c.url}"\n',
                          automation=True)
    status, out = await doctor(config)
    assert status == 1
    first, second, third = lines_of(out, "ollama ")
    assert first == (f"ok   ollama {a.url}: reachable, Ollama {VERSION}, priority 10; has "
                     f"qwen3:4b; lacks {DIGEST}; loaded: qwen3:4b (2.6 GB in GPU memory) -> "
                     f"fix: to serve {DIGEST} there too: OLLAMA_HOST={a.url} ollama pull "
                     f"{DIGEST}")
    assert second == (f"ok   ollama {b.url}: reachable, Ollama {VERSION}, priority 0; has "
                      f"qwen3:4b, {DIGEST}; loaded: nothing")
    assert third.startswith(f"FAIL ollama {c.url}: not reachable at {c.url}")
    assert third.endswith("-> fix: start Ollama there (`ollama serve`), or take it out of "
                          "model.hosts; meanwhile its conversations go to the other hosts")
    assert failed(out) == [third]  # the chat model's own checks are made at a host that has it
    assert "ok   model: qwen3:4b: context length 32768" in out
    assert f"ok   loaded runner: at {a.url}: qwen3:4b is loaded with num_ctx 8192" in out
    assert f"ok   loaded runner: at {b.url}: qwen3:4b is not loaded now" in out

    status, out = await doctor(config, "--json")
    names = [c["name"] for c in json.loads(out)["checks"]]
    assert [f"ollama {h.url}" for h in hosts] == [n for n in names if n.startswith("ollama")]


async def test_a_chat_model_on_no_host_fails_naming_each_and_the_pull_line(
    tmp_path: Path, hosts: tuple[FakeOllama, FakeOllama, FakeOllama],
) -> None:
    a, b, c = hosts
    a.models = [FakeModel(DIGEST)]
    b.models = []
    await c.refuse_connections()
    config = write_config(tmp_path, f'hosts = ["{a.url}", "{b.url}", "{c.url}"]')
    status, out = await doctor(config)
    assert status == 1
    assert failed(out)[-1] == (
        f"FAIL model: qwen3:4b is on none of the Ollama hosts: {a.url} has {DIGEST}; {b.url} "
        f"has no models; {c.url} is not reachable -> fix: pull it on one of them: "
        f"OLLAMA_HOST={a.url} ollama pull qwen3:4b")
    assert "model tools" not in out  # nothing to ask about a model no host has


async def test_a_host_kept_to_other_models_says_so_without_a_pull_line(
    tmp_path: Path, hosts: tuple[FakeOllama, FakeOllama, FakeOllama],
) -> None:
    a, b, _ = hosts
    config = write_config(tmp_path, f'[[model.hosts]]\nurl = "{a.url}"\n'
                          f'[[model.hosts]]\nurl = "{b.url}"\nmodels = ["{DIGEST}"]\n',
                          automation=True)
    status, out = await doctor(config)
    assert status == 0, out
    [_, limited] = lines_of(out, "ollama ")
    assert limited == (f"ok   ollama {b.url}: reachable, Ollama {VERSION}; has {DIGEST}; not "
                       f"serving qwen3:4b (its models: {DIGEST}); loaded: nothing")


async def test_a_pool_of_one_prints_what_it_always_did(
    tmp_path: Path, fake_ollama: FakeOllama,
) -> None:
    config = write_config(tmp_path, f'hosts = ["{fake_ollama.url}"]')
    status, out = await doctor(config)
    assert status == 0, out
    assert f"ok   ollama: reachable at {fake_ollama.url}\n" in out
    assert "ok   loaded runner: qwen3:4b is not loaded now" in out

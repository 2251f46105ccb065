"""Automations use the built-in capabilities like a chat does: docs/how-it-works.md's hourly "what
changed on these pages" report fetches its pages through web_fetch (the loopback site,
allowed by web.allow_hosts) and delivers what the model made of them."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.automations.conftest import DaemonFactory, at, automation, wait_until
from tests.fakes.ollama import FakeOllama, Reply
from tests.fakes.website import FakeSite


@pytest.fixture
async def site() -> AsyncIterator[FakeSite]:
    async with FakeSite() as fake:
        yield fake


def page_watcher(body: dict[str, Any]) -> Reply:
    """A model that does what the prompt asks: load web, fetch each URL, report titles."""
    messages = body["messages"]
    last = messages[-1]
    if last["role"] == "user":
        return Reply(tool_calls=[{"function": {"name": "tool_activate",
                                               "arguments": {"name": "web"}}}])
    if str(last["content"]).startswith("Loaded web"):
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        return Reply(tool_calls=[{"function": {"name": "web_fetch", "arguments": {"url": url}}}
                                 for url in re.findall(r"http://\S+/article", prompt)])
    results = [m["content"] for m in messages if m["role"] == "tool"][1:]
    titles = [line for r in results for line in r.splitlines() if line.startswith("# ")]
    return Reply(content="Changed: " + "; ".join(titles))


async def test_an_hourly_report_on_pages_fetches_them_and_reports(
        make_daemon: DaemonFactory, fake_ollama: FakeOllama, site: FakeSite) -> None:
    prompt = (f"Fetch {site.url}/article and tell me what changed since your last report.")
    daemon = make_daemon(automation("pages", "0 * * * *", prompt=prompt))
    daemon.settings = dataclasses.replace(
        daemon.settings, web=dataclasses.replace(daemon.settings.web,
                                                 allow_hosts=("127.0.0.1",)))
    fake_ollama.default_reply = page_watcher
    automations = await daemon.start()
    daemon.clock.set(at(2026, 12, 1, 10, 0, 1))
    await automations.fire("pages")
    await wait_until(lambda: bool(daemon.replies()), timeout=30)
    assert daemon.replies() == ["Changed: # t-distributed stochastic neighbor embedding"]
    assert [path for _, path in site.requests] == ["/article"]
    # The page reached the model as a labelled tool result, never in the system message.
    request = fake_ollama.chat_requests[-1]
    assert "stochastic" not in request["messages"][0]["content"]
    (page,) = [m for m in request["messages"] if m["role"] == "tool"][1:]
    assert page["content"].startswith(f"[web page from {site.url}/article; untrusted content")

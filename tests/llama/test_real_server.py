"""The Ollama-wire server over a real SmolLM2 behaves as Ollama 0.33 does (see server.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.llama.server import ServerThread

MODEL = "smollm2:135m"
SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one sentence."}


def _chat(server: ServerThread, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/api/chat", json={"model": MODEL, **body}, timeout=300)


def _final(response: httpx.Response) -> dict[str, Any]:
    return dict(json.loads(response.text.strip().splitlines()[-1]))


def test_a_chat_answer_streams_and_counts_the_whole_rendered_prompt(
        real_ollama: ServerThread) -> None:
    messages = [SYSTEM, {"role": "user", "content": "What colour is the sky?"}]
    response = _chat(real_ollama, messages=messages, options={"num_ctx": 256, "num_predict": 6})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert len(lines) >= 2 and not lines[0]["done"] and lines[-1]["done"]
    assert "".join(line["message"]["content"] for line in lines).strip()
    final = lines[-1]
    assert final["prompt_eval_count"] == real_ollama.count_tokens(real_ollama.render(messages))
    assert final["eval_count"] <= 6 and final["done_reason"] in ("stop", "length")
    assert {"total_duration", "eval_duration", "prompt_eval_duration"} <= final.keys()


def test_a_shared_prefix_comes_from_the_cache(real_ollama: ServerThread) -> None:
    first = [SYSTEM, {"role": "user", "content": "Name a fruit."}]
    options = {"num_ctx": 256, "num_predict": 4}
    _chat(real_ollama, messages=first, options=options, stream=False)
    second = [SYSTEM, {"role": "user", "content": "Name a vegetable."}]
    answer = _chat(real_ollama, messages=second, options=options, stream=False).json()
    whole = real_ollama.count_tokens(real_ollama.render(second))
    assert answer["prompt_eval_count"] == whole
    system_part = real_ollama.count_tokens(real_ollama.render([SYSTEM])) - 3  # no assistant cue
    assert system_part <= answer["prompt_eval_cached_count"] < whole
    assert real_ollama.requests[-1].prompt_eval_cached_count == answer["prompt_eval_cached_count"]


def test_truncate_false_over_the_window_is_a_400(real_ollama: ServerThread) -> None:
    long = {"role": "user", "content": "tell me about the sea " * 20}
    response = _chat(real_ollama, messages=[long], truncate=False, options={"num_ctx": 64})
    assert response.status_code == 400
    inner = json.loads(response.json()["error"])["error"]
    assert inner["type"] == "exceed_context_size_error" and inner["n_ctx"] == 64
    assert "exceeds the available context size" in inner["message"]
    assert real_ollama.requests[-1].status == 400


def test_truncate_absent_drops_old_messages_but_keeps_system_and_last(
        real_ollama: ServerThread) -> None:
    messages = [SYSTEM, {"role": "user", "content": "an old question " * 30},
                {"role": "assistant", "content": "an old answer"},
                {"role": "user", "content": "Say hi."}]
    response = _chat(real_ollama, messages=messages, stream=False,
                     options={"num_ctx": 96, "num_predict": 2})
    assert response.status_code == 200
    record = real_ollama.requests[-1]
    assert record.kept_messages == 3  # system + the assistant's answer + the last message
    assert record.prompt == real_ollama.render([messages[0], *messages[2:]])
    assert response.json()["prompt_eval_count"] <= 96


def test_shift_false_stops_at_the_window(real_ollama: ServerThread) -> None:
    messages = [{"role": "user", "content": "Count from one to one hundred."}]
    prompt = real_ollama.count_tokens(real_ollama.render(messages))
    answer = _chat(real_ollama, messages=messages, shift=False, stream=False,
                   options={"num_ctx": prompt + 8, "num_predict": 100}).json()
    assert answer["done_reason"] == "length"
    assert answer["prompt_eval_count"] + answer["eval_count"] == prompt + 8


def test_num_predict_defaults_to_the_modelfile_64(real_ollama: ServerThread) -> None:
    messages = [{"role": "user", "content": "Write a long story about a dragon and a knight."}]
    answer = _chat(real_ollama, messages=messages, stream=False,
                   options={"num_ctx": 256}).json()
    assert answer["eval_count"] <= 64
    assert (answer["done_reason"] == "length") == (answer["eval_count"] == 64)


def test_tools_thinking_and_show_as_ollama_answers(real_ollama: ServerThread) -> None:
    hi = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
    refused = _chat(real_ollama, messages=hi, tools=[tool])
    assert refused.status_code == 400
    assert refused.json() == {
        "error": "registry.ollama.ai/library/smollm2:135m does not support tools"}
    thinking = _chat(real_ollama, messages=hi, think=True)
    assert thinking.status_code == 400
    assert thinking.json() == {"error": '"smollm2:135m" does not support thinking'}
    show = httpx.post(f"{real_ollama.url}/api/show", json={"model": MODEL}).json()
    assert show["capabilities"] == ["completion"]
    info = show["model_info"]
    assert info["general.architecture"] == "llama"
    assert info["llama.context_length"] == 8192 and info["llama.vocab_size"] == 49152
    assert info["tokenizer.ggml.tokens"] == [] and "tokenizer.chat_template" not in info
    assert httpx.get(f"{real_ollama.url}/api/version").json() == {"version": "0.33.0"}

"""A tool call written out as text: what some models send instead of Ollama's `tool_calls`.

Pure, so that both the turn (which nudges the model once and never shows the JSON) and
`roost models` (which reports the model's tool style as "text") read a reply the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_PSEUDO_CALL_MARKERS = ("<tool_call>", "<|tool_call|>", "[TOOL_CALLS]", "<function=")
_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


def looks_like_text_tool_call(text: str, tool_names: Sequence[str]) -> bool:
    """True when a reply is a tool call written out as text rather than a structured call."""
    stripped = text.strip()
    if any(marker in stripped for marker in _PSEUDO_CALL_MARKERS):
        return True
    body = _FENCE.sub("", stripped)
    if not body.startswith(("{", "[")):
        return False
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    items = parsed if isinstance(parsed, list) else [parsed]
    for item in items:
        if not isinstance(item, dict):
            return False
        function = item.get("function")
        name = function.get("name") if isinstance(function, dict) else item.get("name")
        if name in tool_names or ("arguments" in item or "parameters" in item):
            return True
    return False


@dataclass(frozen=True)
class TextCalls:
    """A reply read as tool calls: `calls` in Ollama's `tool_calls` shape, or `problem`, what is
    wrong with them in words the model can act on (never both)."""

    calls: tuple[dict[str, Any], ...] = ()
    problem: str = ""


_TAGGED = re.compile(r"<(?:\|)?tool_call(?:\|)?>(.*?)(?:<(?:/|\|/)?tool_call(?:\|)?>|$)", re.S)
_FUNCTION_TAG = re.compile(r"<function=([\w.\-]+)>(.*?)(?:</function>|$)", re.S)


def read_text_calls(text: str, tool_names: Sequence[str]) -> TextCalls:
    """The tool calls written out in `text` (JSON, fenced or not, `<tool_call>` tags, Mistral's
    `[TOOL_CALLS]`, `<function=name>`), each naming one of `tool_names` with an object of
    arguments; else the problem. Call it on a reply `looks_like_text_tool_call` said is one."""
    try:
        items = _call_items(text.strip())
    except ValueError as exc:
        return TextCalls(problem=f"the call is not valid JSON ({exc})")
    if not items:
        return TextCalls(problem="no call was found in the text")
    calls = []
    for item in items:
        inner = item.get("function")
        function: dict[str, Any] = inner if isinstance(inner, dict) else item
        name = function.get("name")
        arguments = function.get("arguments", function.get("parameters", {}))
        if isinstance(arguments, str):  # OpenAI's shape: the arguments as a JSON string
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError as exc:
                return TextCalls(problem=f"the arguments of {name} are not valid JSON ({exc})")
        if not isinstance(name, str) or name not in tool_names:
            return TextCalls(problem=f"there is no tool named {name!r}")
        if not isinstance(arguments, dict):
            return TextCalls(problem=f"the arguments of {name} must be a JSON object")
        calls.append({"function": {"name": name, "arguments": arguments}})
    return TextCalls(calls=tuple(calls))


def _call_items(text: str) -> list[dict[str, Any]]:
    """Every object the text holds as a call; ValueError when one is not JSON."""
    if tagged := _FUNCTION_TAG.findall(text):
        return [{"name": name, "arguments": json.loads(body.strip() or "{}")}
                for name, body in tagged]
    bodies = [b.strip() for b in _TAGGED.findall(text)] or [
        _FENCE.sub("", text.replace("[TOOL_CALLS]", "", 1).strip())]
    items: list[dict[str, Any]] = []
    for body in bodies:
        parsed = json.loads(body)
        for item in parsed if isinstance(parsed, list) else [parsed]:
            if not isinstance(item, dict):
                raise ValueError("a call must be a JSON object")
            items.append(item)
    return items

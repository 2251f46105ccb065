"""A tool call written out as text: what some models send instead of Ollama's `tool_calls`.

Pure, so that both the turn (which nudges the model once and never shows the JSON) and
`roost models` (which reports the model's tool style as "text") read a reply the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

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

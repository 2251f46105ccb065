"""Tool schemas small models and Ollama's templates can read (pure).

MCP servers describe arguments with full JSON Schema: `$ref` into `$defs`, `anyOf` of several
types (pydantic writes `Optional[X]` as `anyOf: [X, null]`), titles, defaults. Ollama's tool
templates print the schema into the prompt and small models lose their way in it. This makes
one plain object schema: references inlined (a bounded depth), `X | null` as X, an `anyOf` of
several types as its first simple type with the others named in the description, and no
titles. The arguments are still checked against the server's own schema before a call.
Descriptions are the server's own, untrusted text: chat templates print them in the system
prompt, so they lose whatever markup could open or close a prompt section (`_unmarked`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

MAX_DEPTH = 4
DESCRIPTION_CHARS = 300
_NAME = re.compile("[^A-Za-z0-9_-]")
_KEEP = ("type", "description", "enum", "items", "properties", "required", "default")


def tool_name(server: str, tool: str) -> str:
    """The namespaced name the model calls: `server__tool`, in the characters (and the 64
    of them) that OpenAI-style function names allow."""
    return _NAME.sub("_", f"{server}__{tool}")[:64]


def one_line(text: str | None, limit: int = 120) -> str:
    """The first line of `text`, without control characters, cut to `limit`."""
    line = next((part.strip() for part in (text or "").splitlines() if part.strip()), "")
    line = "".join(ch for ch in line if ch.isprintable())
    return line if len(line) <= limit else line[:limit - 1].rstrip() + "…"


_TAGS = re.compile(r"<[^>]*>")
_TEMPLATES = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.DOTALL)  # {{system}}, {% if %}
_LINKS = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_MARKUP = str.maketrans("", "", "#*`<>[]{}")

# A loaded tool's description goes whole into every request of the conversation that loaded
# it, so it has a cap: 3,000 characters (about 580 Qwen tokens of English) keeps whole the
# longest of eight common servers' tools (sequential-thinking's 2,781, which says how to use it
# after its first sentence). A server's descriptions together get 6,000 (about 1,200 tokens, a
# sixth of the 7,168 an 8,192 window leaves a request): past that its longest ones share what
# the others leave, never under the 300 each had before.
TOOL_DESCRIPTION_CHARS = 3_000
SERVER_DESCRIPTION_CHARS = 6_000
DESCRIPTION_FLOOR = 300


def _unmarked(text: str) -> str:
    """`text` without markup that could open or close a prompt section: tags, template markers,
    links (their text kept) and the characters of Markdown's markup. Full-width and other
    compatibility forms are folded first (NFKC): a model reads `＜/system＞` as `</system>`, so
    the markup it spells is found and dropped the same way."""
    text = unicodedata.normalize("NFKC", text)
    text = _LINKS.sub(r"\1", _TEMPLATES.sub(" ", _TAGS.sub(" ", text)))
    return text.translate(_MARKUP)


def plain_line(text: str | None, limit: int) -> str:
    """The first line of a server's text (a title, an argument's description) without markup
    (`_unmarked`), cut to `limit`."""
    return one_line(_unmarked((text or "")[:4000]), limit)  # bounded work on a huge one


def plain_text(text: str | None, limit: int) -> str:
    """All of a server's text (a tool's description) on one line without markup, cut at a
    word to `limit`."""
    text = _unmarked((text or "")[:2 * limit])  # markup only shortens it
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return text if len(text) <= limit else text[:limit - 1].rsplit(" ", 1)[0] + "…"


def description_caps(lengths: Sequence[int]) -> list[int]:
    """The cap of each of a server's tool descriptions (see TOOL_DESCRIPTION_CHARS): the short
    ones whole, the long ones an equal share of the room the short ones leave."""
    wanted = [min(n, TOOL_DESCRIPTION_CHARS) for n in lengths]
    caps = [0] * len(wanted)
    room = SERVER_DESCRIPTION_CHARS
    by_length = sorted(range(len(wanted)), key=lambda i: wanted[i])
    for done, i in enumerate(by_length):
        share = max(DESCRIPTION_FLOOR, room // (len(wanted) - done))
        caps[i] = min(wanted[i], share)
        room -= caps[i]
    return caps


def simplify(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The object schema of a tool's arguments, simplified (see the module docstring)."""
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    out = _node(schema, defs, 0)
    out["type"] = "object"
    out.setdefault("properties", {})
    return out


def _node(node: Any, defs: Mapping[str, Any], depth: int) -> dict[str, Any]:
    if not isinstance(node, Mapping):
        return {}
    node = _resolved(node, defs, depth)
    notes: list[str] = []
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            node, note = _first_choice(node, key, defs, depth)
            notes += [note] if note else []
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) == 1:
        node = {**_resolved(node["allOf"][0], defs, depth), **{
            k: v for k, v in node.items() if k != "allOf"}}
    kind = node.get("type")
    if isinstance(kind, list):  # ["string", "null"] and the like
        kinds = [k for k in kind if k != "null"]
        if len(kinds) > 1:
            notes.append(f"may also be {', '.join(kinds[1:])}")
        kind = kinds[0] if kinds else "string"
    out: dict[str, Any] = {}
    if kind:
        out["type"] = kind
    description = plain_line(str(node.get("description") or ""), DESCRIPTION_CHARS)
    if notes:
        description = "; ".join(filter(None, [description, *notes]))
    if description:
        out["description"] = description[:DESCRIPTION_CHARS]
    if isinstance(node.get("enum"), list):
        out["enum"] = [v for v in node["enum"] if v is not None]
    if "default" in node and node["default"] is not None and _plain(node["default"]):
        out["default"] = node["default"]
    if kind == "object" or "properties" in node:
        out["type"] = "object"
        if depth < MAX_DEPTH and isinstance(node.get("properties"), Mapping):
            out["properties"] = {str(k): _node(v, defs, depth + 1)
                                 for k, v in node["properties"].items()}
            required = [r for r in node.get("required", ()) if r in out["properties"]]
            if required:
                out["required"] = required
    if kind == "array" and depth < MAX_DEPTH and isinstance(node.get("items"), Mapping):
        out["items"] = _node(node["items"], defs, depth + 1)
    return out


def _resolved(node: Mapping[str, Any], defs: Mapping[str, Any], depth: int) -> Mapping[str, Any]:
    """`node` with its `$ref` (into #/$defs or #/definitions) followed, a few levels at most."""
    for _ in range(MAX_DEPTH):
        ref = node.get("$ref")
        if not isinstance(ref, str):
            break
        target = defs.get(ref.rsplit("/", 1)[-1])
        if not isinstance(target, Mapping):
            return {k: v for k, v in node.items() if k != "$ref"} or {"type": "object"}
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _first_choice(node: Mapping[str, Any], key: str, defs: Mapping[str, Any],
                  depth: int) -> tuple[dict[str, Any], str]:
    """An `anyOf`/`oneOf` as its first non-null choice; a note naming the other types."""
    choices = [_resolved(c, defs, depth) for c in node[key] if isinstance(c, Mapping)]
    real = [c for c in choices if c.get("type") != "null"]
    rest = {k: v for k, v in node.items() if k != key}
    if not real:
        return {**rest, "type": rest.get("type", "string")}, ""
    first = real[0]
    others = sorted({str(c.get("type", "object")) for c in real[1:]} - {str(first.get("type"))})
    note = f"may also be {', '.join(others)}" if others else ""
    return {**first, **rest}, note


def _plain(value: Any) -> bool:
    return isinstance(value, str | int | float | bool)
